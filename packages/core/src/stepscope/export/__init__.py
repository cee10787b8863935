"""Exports of a job to other tools: its saved tensors as TensorBoard event files (scalars
and histograms, one run per mode) or one HDF5 file (datasets stacked over steps), and the
merged timeline (step timeline, system metrics, detailed traces, rule firings) as one
Perfetto trace.

The tensor exports read through the public Trial API only, step batch by step batch, so
memory stays bounded on large jobs. Modules load on first use, so `stepscope --help` stays fast."""

from __future__ import annotations

from .._lazy import lazy_getattr

_LAZY = {
    "Selection": "selection",
    "export_tensorboard": "tensorboard",
    "export_hdf5": "hdf5",
    "hdf5_key": "hdf5",
    "TensorBoardWriter": "tb_writer",
    "histogram_proto": "tb_writer",
    "write_timeline": "perfetto",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = list(_LAZY)
