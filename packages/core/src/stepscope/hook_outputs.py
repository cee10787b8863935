"""What a hook writes beyond tensors, by option: the same values as TensorBoard scalars and
histograms while the job runs (`tensorboard_dir=`), the job's report at close
(`report=True`), and always stepscope's own cost (time in the hooks and in the writer per
step, bytes written; see `cost`). The hook base calls `HookOutputs` at a few points; every
call is fail-safe, so none of this can break training."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import numpy as np

from .cost import CostMeter, cost_key
from .modes import ModeKeys

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


class _LiveTensorBoard:
    """A writer-thread listener: every saved step of this worker, as TensorBoard summaries."""

    def __init__(self, logdir: str, worker: str, several_workers: bool):
        from .export.tb_writer import TensorBoardWriter

        self.writer = TensorBoardWriter(logdir)
        self.worker, self.several = worker, several_workers

    def __call__(self, step: int, mode: ModeKeys, mode_step: int, arrays: dict[str, np.ndarray]) -> None:
        from .export.tensorboard import run_name, summary_values

        values, _, _ = summary_values(arrays)
        if values:
            self.writer.add_values(run_name(mode, self.worker, self.several), step, values)
            self.writer.flush()  # TensorBoard shows live values only once they are on disk

    def close(self) -> None:
        self.writer.close()


class HookOutputs:
    """Per hook: `attach(writer)` once the writer exists, `instrument(hook, outputs)` to
    time the hook's entry points into `meter`, `close(store, writer)` after the writer
    closed."""

    def __init__(self, worker: str, *, tensorboard_dir: str | None = None, report: bool = False, several_workers: bool = False, chief: bool = True):
        self.worker = worker
        self.tensorboard_dir = tensorboard_dir
        self.report = bool(report)
        self.several_workers = several_workers
        self.chief = chief
        self.meter = CostMeter(worker)
        self._live: _LiveTensorBoard | None = None

    def attach(self, writer: Any) -> None:
        if self.tensorboard_dir and writer is not None:
            self._live = _LiveTensorBoard(self.tensorboard_dir, self.worker, self.several_workers)
            writer.step_listeners.append(self._live)

    def close(self, store: Any, writer: Any, next_step: int | None = None) -> None:
        """Publish the cost file, close the live TensorBoard files, and write the report
        (chief worker only, after the writer published everything). `next_step`: the
        hook's next global step (the meter counts steps in blocks). Never raises."""
        self.meter.step_ends(time.perf_counter(), next_step)
        if self._live is not None:
            _quietly("close the TensorBoard files", self._live.close)
        if store is None:
            return
        self.meter.cost.versions.update(imported_versions())
        busy = getattr(writer, "busy_s", 0.0) if writer is not None else 0.0
        written = getattr(writer, "bytes_written", 0) if writer is not None else 0
        _quietly("publish its cost file", lambda: store.write(cost_key(self.worker), self.meter.to_bytes(busy, written)))
        if self.report and self.chief:
            def _report() -> None:
                from .report import write_report

                written_report = write_report(store)
                logger.warning("stepscope: report written to %s", written_report.html)

            _quietly("write the report", _report)


# The hook's entry points whose time counts as "in the hooks": the step driver, the
# save calls, and what plugins call for every tensor of a due step (nested calls count once).
# Not phase_event / finish_step_timing themselves: on a step where nothing is due they are a
# clock reading and a deque append, which a timed wrapper would make several times dearer
# (issue 14: such a step costs little more than torch's dispatch of the hooks). What they
# do on due steps (saving gradients, optimizer state) is `_on_phase_event`, timed.
_TIMED_METHODS = ("end_step", "_on_phase_event", "save_tensor", "save_scalar", "save_loss", "plan", "record", "flush")


def instrument(hook: Any, outputs: HookOutputs) -> None:
    """Time `hook`'s entry points into `outputs.meter`: each is replaced, on this instance
    only, by a timed wrapper. (begin_step times itself and clocks the steps: it runs on
    every step, where a wrapper's frame would cost more than the rest of it.)"""
    meter = outputs.meter
    for name in _TIMED_METHODS:
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
