"""The plugin contract: what a framework package adds to `HookBase` (in the spirit of
OpenTelemetry's `BaseInstrumentor`: core implements the whole public surface once; a
plugin only tells core about its framework). A third framework (JAX, say) is one more
small package that subclasses HookBase and provides these; `missing_parts(cls)` says which
a class still lacks (the plugins' tests check theirs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from .tensor_saver import TensorPlan


@runtime_checkable
class FrameworkPlugin(Protocol):
    """What a plugin provides. HookBase has a default for each (a hook that sees no
    framework: env-var ranks, numpy values only), so a plugin overrides what it knows."""

    # Its framework's name ("pytorch", "tensorflow") and the built-in collections' regexes
    # over its tensor names ({"weights": [...], "gradients": [...]}).
    framework: ClassVar[str]
    builtin_regexes: ClassVar[Mapping[str, Sequence[str]]]

    # Rank detection: (rank, world size, local rank) of this process.
    def _detect_rank(self) -> tuple[int, int, int]: ...

    # Capture to host: copy one framework tensor (or its reductions, computed where it
    # lives) and `record` it; False for a value that is not the framework's.
    def _capture(self, plan: TensorPlan, value: Any) -> bool: ...

    def _is_framework_value(self, value: Any) -> bool: ...

    # Optional (`save_values`): capture several (plan, value) pairs of the open step at once,
    # in one pass, `record`ing each; returns the pairs left for
    # `_capture` one by one. Without it each pair goes through `_capture`.
    # def _capture_many(self, items: Sequence[tuple[TensorPlan, Any]]) -> Sequence[tuple[TensorPlan, Any]]: ...

    # Tensor discovery and framework events: around a step (all steps, or only those where
    # something is due with `notify_every_step = False`), at a phase event of a due step,
    # and at close (remove what it installed). The plugin calls the driver (`begin_step` /
    # `_open_step`, `phase_event`, `finish_step_timing`, `end_step`) from its framework's
    # events, and `save_value(name, value, collections)` for each tensor it discovers.
    def _on_step_begin(self, due: bool) -> None: ...

    def _on_step_end(self) -> None: ...

    def _on_phase_event(self, event: str) -> None: ...

    def _on_close(self) -> None: ...


# What a real framework plugin must supply itself (HookBase's defaults see no framework);
# the step callbacks are optional (a plugin may discover tensors in `_on_phase_event` only).
REQUIRED = ("_detect_rank", "_capture", "_is_framework_value", "_on_close")
DISCOVERY = ("_on_step_begin", "_on_step_end", "_on_phase_event")


def missing_parts(cls: type) -> list[str]:
    """The parts of the contract `cls` (a HookBase subclass) does not provide itself."""
    from .hook import HookBase

    missing = [name for name in REQUIRED if getattr(cls, name, None) is getattr(HookBase, name)]
    if getattr(cls, "framework", "generic") == "generic":
        missing.append("framework")
    if not getattr(cls, "builtin_regexes", None):
        missing.append("builtin_regexes")
    if all(getattr(cls, name, None) is getattr(HookBase, name) for name in DISCOVERY):
        missing.append("one of " + " / ".join(DISCOVERY))
    return missing


__all__ = ["DISCOVERY", "REQUIRED", "FrameworkPlugin", "missing_parts"]
