"""`stepscope export --hdf5 FILE`: the selected tensors and steps of a job in one HDF5 file.

Layout (h5py): `/tensors/<key>/` per tensor, `<key> = hdf5_key(name)` (the name with `/`
and `%` percent-quoted; the group's `name` attribute holds the tensor's own name), with
- `values`: the values stacked over saved steps, shape (n, *tensor shape), chunked, gzip;
- `step`, `mode`, `mode_step`, `worker`: n-long index datasets (global step, ModeKeys
  number, step within the mode, index into the root `/workers` dataset).
A tensor whose shape changes keeps each further shape in a subgroup `shape_<d0>x<d1>...`
with the same datasets. Root attributes: `source` (the job), `modes` (number -> name).
Rows are appended batch by batch, so memory stays bounded whatever the job's size."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import ml_dtypes
import numpy as np

from ..exceptions import ConfigError
from ..modes import ModeKeys
from ..outputs import atomic_output, check_output_target
from ..trial import Trial, create_trial
from .selection import Selection, iter_step_values

_CHUNK_BYTES = 1 << 20  # ~1 MiB chunks: large enough for gzip, small enough to append
# Rows gathered before they are written: at most this many, or this many bytes of values.
_FLUSH_ROWS = 4096
_FLUSH_BYTES = 64 << 20


def hdf5_key(name: str) -> str:
    """The group name of tensor `name` under /tensors (`gradient/fc1.weight` ->
    `gradient%2Ffc1.weight`), so names never nest or collide."""
    return quote(name, safe="")


def _shape_group(shape: tuple[int, ...]) -> str:
    return "shape_" + ("x".join(str(d) for d in shape) or "scalar")


@dataclass
class HDF5Export:
    path: str
    tensors: int = 0
    rows: int = 0


class _Series:
    """The growing datasets of one tensor (one shape)."""

    def __init__(self, group: Any, sample: np.ndarray, compression: str | None):
        self.shape = sample.shape
        dtype = h5_dtype(sample.dtype)
        item = max(sample.dtype.itemsize, 1) * max(int(np.prod(sample.shape)), 1)
        rows_per_chunk = int(max(1, min(1024, _CHUNK_BYTES // item)))
        self.values = group.create_dataset(
            "values", shape=(0, *sample.shape), maxshape=(None, *sample.shape), dtype=dtype,
            chunks=(rows_per_chunk, *sample.shape) if sample.size else None,
            compression=compression if sample.size else None, compression_opts=_level(compression) if sample.size else None,
        )
        self.index = {
            key: group.create_dataset(key, shape=(0,), maxshape=(None,), dtype=kind, chunks=(4096,), compression=compression, compression_opts=_level(compression))
            for key, kind in (("step", "i8"), ("mode", "i1"), ("mode_step", "i8"), ("worker", "i4"))
        }
        self.pending: list[tuple[np.ndarray, int, int, int, int]] = []

    def add(self, value: np.ndarray, step: int, mode: int, mode_step: int, worker: int) -> None:
        self.pending.append((value, step, mode, mode_step, worker))

    def flush(self) -> int:
        if not self.pending:
            return 0
        count = len(self.pending)
        start = self.values.shape[0]
        self.values.resize(start + count, axis=0)
        self.values[start:] = np.stack([p[0] for p in self.pending])
        for position, key in enumerate(("step", "mode", "mode_step", "worker"), start=1):
            dataset = self.index[key]
            dataset.resize(start + count, axis=0)
            dataset[start:] = np.array([p[position] for p in self.pending])
        self.pending.clear()
        return count


def _level(compression: str | None) -> int | None:
    # gzip level 1: about the ratio of the default (4) on float data, at a fraction of the time.
    return 1 if compression == "gzip" else None


def h5_dtype(dtype: np.dtype) -> Any:
    import h5py

    if dtype.kind in "USO":
        return h5py.string_dtype()
    if dtype == _BFLOAT16:  # HDF5 has no bfloat16; float32 holds it exactly
        return np.float32
    return dtype


_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _as_storable(value: np.ndarray) -> np.ndarray:
    kind = value.dtype.kind
    if kind in "biuf":
        return value
    if kind == "U":
        return value.astype(object)
    if value.dtype == _BFLOAT16:
        return value.astype(np.float32)
    return value


def export_hdf5(
    trial: Trial | str, path: str | os.PathLike[str], selection: Selection | None = None, *,
    compression: str | None = "gzip", progress: Any = None,
) -> HDF5Export:
    """Write the selected tensors of `trial` to the HDF5 file at `path` (replaced if present)."""
    import h5py

    if compression not in (None, "gzip", "lzf"):
        raise ConfigError(f"compression must be 'gzip', 'lzf' or None, got {compression!r}")
    trial = create_trial(trial) if isinstance(trial, str) else trial
    selection = selection or Selection()
    path = os.fspath(path)
    workers = trial.workers() or ["worker_0"]
    worker_index = {w: i for i, w in enumerate(workers)}
    result = HDF5Export(path)
    check_output_target(path)  # before the (long) export, not after it
    with atomic_output(path) as handle, h5py.File(handle, "w") as h5:
        h5.attrs["source"] = trial.path
        h5.attrs["modes"] = json.dumps({int(m): m.name for m in ModeKeys})
        h5.attrs["writer"] = "stepscope"
        h5.create_dataset("workers", data=np.array(workers, dtype=object), dtype=h5py.string_dtype())
        tensors = h5.create_group("tensors")
        series: dict[tuple[str, tuple[int, ...]], _Series] = {}
        first_shape: dict[str, tuple[int, ...]] = {}
        batch_rows = batch_bytes = 0
        for item in iter_step_values(trial, selection, progress, wall_time=False):
            for name, value in item.values.items():
                value = _as_storable(np.asarray(value))
                key = (name, value.shape)
                target = series.get(key)
                if target is None:
                    group = tensors.require_group(hdf5_key(name))
                    group.attrs["name"] = name
                    if name in first_shape:
                        group = group.create_group(_shape_group(value.shape))
                    else:
                        first_shape[name] = value.shape
                    target = series[key] = _Series(group, value, compression)
                target.add(value, item.step, int(item.mode), item.mode_step, worker_index.get(item.worker, -1))
                batch_rows += 1
                batch_bytes += value.nbytes
            if batch_rows >= _FLUSH_ROWS or batch_bytes >= _FLUSH_BYTES:  # bounded memory
                result.rows += sum(s.flush() for s in series.values())
                batch_rows = batch_bytes = 0
        result.rows += sum(s.flush() for s in series.values())
        result.tensors = len(first_shape)
    return result
