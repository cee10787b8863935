"""`stepscope report` and `stepscope export` from the command line."""

from __future__ import annotations

import io

import h5py
import numpy as np

from stepscope.cli import main
from stepscope.progress import ProgressBar


def test_export_both_and_report(tmp_path, write_job, capsys):
    written, _ = write_job(str(tmp_path / "job"), steps=4, eval_steps=1)
    assert main(["export", str(tmp_path / "job"), "--tensorboard", str(tmp_path / "tb"), "--hdf5", str(tmp_path / "j.h5"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "runs eval, train" in out and "HDF5: 2 tensors, 10 rows" in out
    with h5py.File(tmp_path / "j.h5") as h5:
        np.testing.assert_array_equal(h5["tensors"]["loss"]["values"][:], [written[s]["loss"] for s in range(5)])
    assert main(["report", str(tmp_path / "job"), "-o", str(tmp_path / "r" / "x.html"), "--rules", "none", "--no-progress"]) == 0
    assert (tmp_path / "r" / "x.html").read_text().startswith("<!DOCTYPE html>")


def test_bad_usage_exits_2_with_a_message(tmp_path, write_job, capsys):
    write_job(str(tmp_path / "job"), steps=2, eval_steps=0)
    assert main(["export", str(tmp_path / "job")]) == 2
    assert "--tensorboard DIR and/or --hdf5 FILE" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "job"), "--hdf5", str(tmp_path / "x.h5"), "--steps", "7:x"]) == 2
    assert "--steps must be A:B" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nothing"), "--hdf5", str(tmp_path / "x.h5")]) == 2
    assert "no saved" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "no saved data" in capsys.readouterr().err


def test_progress_bar():
    stream = io.StringIO()
    with ProgressBar("export", enabled=True, stream=stream, every=0) as bar:
        bar(0, 4)
        bar(2, 4)
        bar(4, 4)
    text = stream.getvalue()
    assert "\rexport [" + "#" * 15 + "." * 15 + "] 2/4" in text and text.endswith("] 4/4\n")
    quiet = io.StringIO()
    ProgressBar("x", stream=quiet)(1, 2)  # not a terminal: off by default
    assert quiet.getvalue() == ""
