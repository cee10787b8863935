"""`stepscope export --tensorboard DIR`: a job's losses, metrics and saved reductions as
TensorBoard scalars and its other saved tensors as histograms, one run per mode
(`DIR/train`, `DIR/eval`, ...; `DIR/train/worker_1` ... with several workers)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..modes import ModeKeys
from ..reductions import parse_reduction_tensor_name
from ..trial import Trial, create_trial
from .selection import Selection, iter_step_values
from .tb_writer import DEFAULT_BINS, TensorBoardWriter, histogram_proto, histogram_value, scalar_value


@dataclass
class TensorBoardExport:
    """What an export wrote: runs, and how many scalar and histogram values."""

    logdir: str
    runs: list[str] = field(default_factory=list)
    scalars: int = 0
    histograms: int = 0
    steps: int = 0


def scalar_tag(name: str) -> str:
    """A reduction tensor `smdebug/reductions/<r>/<tensor>` is shown as `<tensor>/<r>`, so it
    sits beside the tensor's other charts; any other name is its own tag."""
    parsed = parse_reduction_tensor_name(name)
    if parsed is None:
        return name
    tensor, reduction, is_abs = parsed
    return f"{tensor}/{'abs_' if is_abs else ''}{reduction}"


def run_name(mode: ModeKeys, worker: str, several_workers: bool) -> str:
    run = mode.name.lower()
    return f"{run}/{worker}" if several_workers else run


def summary_values(values: dict[str, np.ndarray], bins: int = DEFAULT_BINS) -> tuple[list[Any], int, int]:
    """(Summary.Values, scalars, histograms) for one step: one-element numeric tensors are
    scalars, larger ones histograms; strings and empty tensors are skipped."""
    out: list[Any] = []
    scalars = histograms = 0
    for name, value in values.items():
        array = np.asarray(value)
        if array.dtype.kind not in "biuf" or array.size == 0:
            continue
        if array.size == 1:
            out.append(scalar_value(scalar_tag(name), float(array.reshape(-1)[0])))
            scalars += 1
        else:
            histo = histogram_proto(array, bins)
            if histo is not None:
                out.append(histogram_value(name, histo))
                histograms += 1
    return out, scalars, histograms


def export_tensorboard(
    trial: Trial | str, logdir: str | os.PathLike[str], selection: Selection | None = None, *,
    step_axis: str = "global", bins: int = DEFAULT_BINS, progress: Any = None,
) -> TensorBoardExport:
    """Write the selected tensors of `trial` as TensorBoard runs under `logdir`.
    `step_axis="global"` puts every mode on the global step (train and eval curves line
    up); `"mode"` uses each mode's own step count."""
    from ..exceptions import ConfigError

    if step_axis not in ("global", "mode"):
        raise ConfigError(f"step_axis must be 'global' or 'mode', got {step_axis!r}")
    trial = create_trial(trial) if isinstance(trial, str) else trial
    selection = selection or Selection()
    several = len(trial.workers()) > 1
    result = TensorBoardExport(os.fspath(logdir))
    runs: set[str] = set()
    seen_steps: set[int] = set()
    with TensorBoardWriter(logdir, bins=bins, atomic=True) as writer:
        for item in iter_step_values(trial, selection, progress):
            values, scalars, histograms = summary_values(item.values, bins)
            if not values:
                continue
            run = run_name(item.mode, item.worker, several)
            step = item.step if step_axis == "global" else item.mode_step
            writer.add_values(run, step, values, item.wall_time)
            runs.add(run)
            seen_steps.add(item.step)
            result.scalars += scalars
            result.histograms += histograms
    result.runs = sorted(runs)
    result.steps = len(seen_steps)
    return result
