"""Deprecated name of the hook contract, kept so that code written against it keeps working:
`HookCore(out_dir, framework=..., builtin_regexes=..., **options)` is a `HookBase` whose
framework is given per instance. New code subclasses `stepscope.hook.HookBase`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .hook import HookBase, StepState, StopTrainingRequested, TensorPlan
from .safety import disabled_by_env


class HookCore(HookBase):
    """A `HookBase` for callers that drive it by hand (tests, tools)."""

    def __init__(self, out_dir: Any, *, framework: str = "generic", builtin_regexes: Mapping[str, Sequence[str]] | None = None, **kwargs: Any):
        self.framework = framework  # type: ignore[misc]  # per instance here, a class attribute in plugins
        self.builtin_regexes = dict(builtin_regexes or {})  # type: ignore[misc]
        super().__init__(out_dir, **kwargs)

    def end_step(self, *, raise_on_stop: bool = False) -> None:
        """As before the contract existed: never raises on a stop request (callers read
        `stop_requested`)."""
        super().end_step(raise_on_stop=raise_on_stop)

    def save_numpy(self, name: str, value: Any, collections: Sequence[str] = ()) -> None:
        """Save a host value at the open step (the plugin-side `save_value`)."""
        self.save_value(name, value, tuple(collections))


__all__ = ["HookCore", "StepState", "TensorPlan", "StopTrainingRequested", "disabled_by_env"]
