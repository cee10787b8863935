"""The HDF5 export, read back with h5py and compared with the trial's own values."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from stepscope import create_trial
from stepscope.exceptions import ConfigError
from stepscope.export import Selection, export_hdf5, hdf5_key
from stepscope.modes import ModeKeys


def _rows(group, workers):
    return [(int(s), int(m), int(ms), workers[int(w)]) for s, m, ms, w in zip(group["step"][:], group["mode"][:], group["mode_step"][:], group["worker"][:])]


def test_every_tensor_reads_back_equal_to_the_trial(export_job, tmp_path):
    path, written, modes = export_job
    target = tmp_path / "job.h5"
    result = export_hdf5(path, target)
    trial = create_trial(path)
    # (Every tensor with a saved value: a tensor saved only as reductions is listed under
    # its own name too, and exported as its reductions' tensors.)
    names = [n for n in trial.tensor_names() if any(trial.tensor(n).has_value(s) for s in trial.tensor(n).steps())]
    assert result.tensors == len(names)
    with h5py.File(target, "r") as h5:
        workers = [w.decode() if isinstance(w, bytes) else w for w in h5["workers"][:]]
        assert workers == ["worker_0", "worker_1"]
        assert h5.attrs["source"] == trial.path
        for name in names:
            group = h5["tensors"][hdf5_key(name)]
            assert group.attrs["name"] == name
            series = [group] + [group[k] for k in group if k.startswith("shape_")]
            seen = set()
            for part in series:
                values = part["values"]
                for row, (step, mode, mode_step, worker) in enumerate(_rows(part, workers)):
                    assert (ModeKeys(mode), mode_step) == modes[step]
                    expected = trial.tensor(name).value(step, worker=worker)
                    got = values[row]
                    if expected.dtype.kind == "U":
                        assert [g.decode() for g in np.atleast_1d(got)] == list(expected)
                    else:
                        np.testing.assert_array_equal(got, expected)
                        assert values.dtype == expected.dtype
                    seen.add((worker, step))
            assert seen == set(written)
        inputs = h5["tensors"]["inputs"]
        # The shape changed at the last step of each mode: those rows sit in a subgroup.
        assert inputs["values"].shape == (14, 3, 2) and inputs["shape_2x2"]["values"].shape == (4, 2, 2)
        weights = h5["tensors"]["fc.weight"]["values"]
        assert weights.compression == "gzip" and weights.chunks is not None


def test_selection(export_job, tmp_path):
    path, written, modes = export_job
    target = tmp_path / "part.h5"
    export_hdf5(path, target, Selection.from_args(regex=["weight"], steps="2:4", mode="train"))
    with h5py.File(target, "r") as h5:
        assert sorted(h5["tensors"]) == [hdf5_key("fc.weight"), hdf5_key("smdebug/reductions/l2/gradient/fc.weight")]
        group = h5["tensors"]["fc.weight"]
        assert sorted(set(group["mode_step"][:])) == [2, 3, 4]
        for row, step in enumerate(group["step"][:]):
            worker = ["worker_0", "worker_1"][group["worker"][row]]
            np.testing.assert_array_equal(group["values"][row], written[(worker, int(step))]["fc.weight"])


def test_many_steps_stream_in_batches(tmp_path, write_job):
    written, _ = write_job(str(tmp_path / "long"), steps=150, eval_steps=0)
    calls = []
    export_hdf5(str(tmp_path / "long"), tmp_path / "long.h5", progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, 150) and calls[-1] == (150, 150) and len(calls) > 3
    with h5py.File(tmp_path / "long.h5", "r") as h5:
        np.testing.assert_array_equal(h5["tensors"]["fc.weight"]["values"][:], np.stack([written[s]["fc.weight"] for s in range(150)]))


def test_bad_compression(export_job, tmp_path):
    with pytest.raises(ConfigError, match="compression"):
        export_hdf5(export_job[0], tmp_path / "x.h5", compression="zstd")
    assert not (tmp_path / "x.h5").exists()


def test_rows_are_written_out_by_bytes_too(tmp_path, write_job, monkeypatch):
    import stepscope.export.hdf5 as hdf5_module

    written, _ = write_job(str(tmp_path / "job"), steps=20, eval_steps=0)
    flushes = []
    original = hdf5_module._Series.flush
    monkeypatch.setattr(hdf5_module, "_FLUSH_BYTES", 200)  # a few fc.weight rows (48 bytes each)
    monkeypatch.setattr(hdf5_module._Series, "flush", lambda self: flushes.append(len(self.pending)) or original(self))
    export_hdf5(str(tmp_path / "job"), tmp_path / "j.h5")
    assert max(flushes) <= 8 and sum(flushes) == 40  # 20 steps x (fc.weight, loss)
    with h5py.File(tmp_path / "j.h5") as h5:
        np.testing.assert_array_equal(h5["tensors"]["fc.weight"]["values"][:], np.stack([written[s]["fc.weight"] for s in range(20)]))
