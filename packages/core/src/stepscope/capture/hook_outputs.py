"""What a hook writes beyond tensors: always stepscope's own cost (time in the hooks and in
the writer per step, bytes written; see `cost`), and, by option, outputs that the analysis
side provides: live TensorBoard scalars and histograms (`tensorboard_dir=`), the job's
report at close (`report=True`).

The training side names those outputs but imports none of their code: the analysis side
registers each by name (`register_output`, done for the built-in ones by the top-level
package; a "module:attribute" string is imported only when a hook's options ask for it).
So a training process that asks for neither never imports TensorBoard or the report, and
the layering is checked in lint. Every call the hook base makes here is fail-safe: none of
this can break training."""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .cost import CostMeter, cost_key

logger = logging.getLogger("stepscope")

# Modules whose versions the report shows, when the training process had them imported.
_VERSIONED_MODULES = ("torch", "lightning", "pytorch_lightning", "tensorflow", "keras", "jax", "numpy", "stepscope")


def imported_versions() -> dict[str, str]:
    """{module: version} of the frameworks this process imported (nothing is imported here)."""
    out = {}
    for name in _VERSIONED_MODULES:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if isinstance(version, str):
            out[name] = version
    return out


@dataclass(frozen=True)
class OutputRequest:
    """What an output factory is given: the worker, the option's value (the TensorBoard
    folder; True for the report), and whether the job has several workers / this is the
    chief (rank 0)."""

    worker: str
    setting: Any
    several_workers: bool = False
    chief: bool = True


class HookOutput(Protocol):
    """One output of a hook, made by a registered factory. `attach(writer)` runs once the
    writer exists (add a step listener there to see every saved step on the writer's
    thread); `close(store, writer)` after the writer published everything and the cost file
    is written (store may be None when the hook never opened one). Either may raise: the
    hook reports it and goes on."""

    def attach(self, writer: Any) -> None: ...

    def close(self, store: Any, writer: Any) -> None: ...


OutputFactory = Callable[[OutputRequest], "HookOutput | None"]

_registry: dict[str, OutputFactory | str] = {}
_registry_lock = threading.Lock()


def register_output(name: str, factory: OutputFactory | str) -> None:
    """Register the output `name`: `factory(request)` makes it for a hook whose options
    ask for it (None: nothing to do for that hook). A "module:attribute" string is
    imported on first use. Registering a name again replaces it."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_output: the name must be a non-empty string, got {name!r}")
    if isinstance(factory, str) and factory.count(":") != 1:
        raise ValueError(f"register_output({name!r}): a factory given by name must read 'module:attribute', got {factory!r}")
    if not isinstance(factory, str) and not callable(factory):
        raise ValueError(f"register_output({name!r}): the factory must be callable or 'module:attribute', got {factory!r}")
    with _registry_lock:
        _registry[name] = factory


def registered_outputs() -> tuple[str, ...]:
    """The names registered so far."""
    with _registry_lock:
        return tuple(_registry)


def output_factory(name: str) -> OutputFactory:
    """The factory registered as `name` (imported now when given by name)."""
    with _registry_lock:
        factory = _registry.get(name)
    if factory is None:
        raise LookupError(f"no hook output named {name!r} is registered (registered: {', '.join(registered_outputs()) or 'none'})")
    if isinstance(factory, str):
        module_name, _, attribute = factory.partition(":")
        factory = getattr(importlib.import_module(module_name), attribute)
        with _registry_lock:
            _registry[name] = factory
    return factory


class HookOutputs:
    """Per hook: `attach(writer)` once the writer exists, `instrument(hook, outputs)` to
    time the hook's entry points into `meter`, `close(store, writer)` after the writer
    closed. `tensorboard_dir` and `report` ask for the registered outputs "tensorboard"
    and "report"."""

    def __init__(self, worker: str, *, tensorboard_dir: str | None = None, report: bool = False, several_workers: bool = False, chief: bool = True):
        self.worker = worker
        self.several_workers = several_workers
        self.chief = chief
        self.meter = CostMeter(worker)
        wanted = {"tensorboard": tensorboard_dir or None, "report": bool(report) or None}
        self._wanted = {name: setting for name, setting in wanted.items() if setting is not None}
        self._outputs: list[tuple[str, HookOutput]] = []

    def attach(self, writer: Any) -> None:
        """Make the outputs the options asked for (a failure here is the hook's own: the
        user asked for the output and would otherwise not get it, silently)."""
        if writer is None:
            return
        for name, setting in self._wanted.items():
            output = output_factory(name)(OutputRequest(self.worker, setting, self.several_workers, self.chief))
            if output is not None:
                output.attach(writer)
                self._outputs.append((name, output))

    def close(self, store: Any, writer: Any, next_step: int | None = None) -> None:
        """Publish the cost file, then close the outputs (the report, chief worker only,
        reads the whole job: this runs after the writer published everything).
        `next_step`: the hook's next global step (the meter counts steps in blocks).
        Never raises."""
        self.meter.step_ends(time.perf_counter(), next_step)
        if store is not None:
            self.meter.cost.versions.update(imported_versions())
            busy = getattr(writer, "busy_s", 0.0) if writer is not None else 0.0
            written = getattr(writer, "bytes_written", 0) if writer is not None else 0
            _quietly("publish its cost file", lambda: store.write(cost_key(self.worker), self.meter.to_bytes(busy, written)))
        for name, output in self._outputs:
            _quietly(f"finish its {name} output", lambda output=output: output.close(store, writer))


# The hook's entry points whose time counts as "in the hooks": the step driver, the
# save calls, what plugins call for every tensor of a due step, and the plugin's captures
# (`_capture`, `_capture_many`: where a framework's tensors are copied to the host, which
# costs more than the rest of a save step; timed only around `record`, the copy made
# before it went uncounted). Nested calls count once. A plugin names the callbacks that
# its framework calls on due steps only in `_TIMED_CALLBACKS` (torch: a gradient's hook).
# Not phase_event / finish_step_timing themselves: on a step where nothing is due they are a
# clock reading and a deque append, which a timed wrapper would make several times dearer
# (issue 14: such a step costs little more than torch's dispatch of the hooks). What they
# do on due steps (saving gradients, optimizer state) is `_on_phase_event`, timed.
_TIMED_METHODS = ("end_step", "_on_phase_event", "save_tensor", "save_scalar", "save_loss", "plan", "record", "flush", "_capture", "_capture_many")


def instrument(hook: Any, outputs: HookOutputs) -> None:
    """Time `hook`'s entry points into `outputs.meter`: each is replaced, on this instance
    only, by a timed wrapper. (begin_step times itself and clocks the steps: it runs on
    every step, where a wrapper's frame would cost more than the rest of it.)"""
    meter = outputs.meter
    for name in _TIMED_METHODS + tuple(getattr(hook, "_TIMED_CALLBACKS", ())):
        method = getattr(hook, name, None)
        if method is not None:
            setattr(hook, name, meter.timed(method))
    hook._meter = meter
    hook._counters.meter_at = 0  # (NEVER without a meter) the first step is timed


def _quietly(what: str, call: Any) -> None:
    try:
        call()
    except Exception as exc:  # training is over or going on: an optional output must not break it
        logger.warning("stepscope: could not %s: %s", what, exc)


__all__ = ["HookOutput", "HookOutputs", "OutputRequest", "imported_versions", "instrument", "output_factory", "register_output", "registered_outputs"]
