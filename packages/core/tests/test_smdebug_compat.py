"""Output written by the real smdebug 1.0.34 (fixtures/smdebug_1_0_34, made by
fixtures/make_smdebug_fixture.py) opens with the same API as ours, with the right names,
steps, values and reductions; expected values were taken from torch by the training loop."""

import json
from pathlib import Path

import numpy as np
import pytest

from stepscope import ModeKeys, create_trial
from stepscope.reductions import parse_reduction_tensor_name

FIXTURE = Path(__file__).parent / "fixtures" / "smdebug_1_0_34"


@pytest.fixture(scope="module")
def trial():
    return create_trial(str(FIXTURE / "trial"))


@pytest.fixture(scope="module")
def expected():
    meta = json.loads((FIXTURE / "expected.json").read_text())
    with np.load(FIXTURE / "expected.npz") as values:
        return meta, {k: values[k] for k in values.files}


def test_steps_modes_and_names(trial, expected):
    meta, _ = expected
    assert trial.is_complete() and trial.workers() == ["worker_0"]
    assert trial.steps() == meta["global_steps"]
    for mode, steps in meta["mode_steps"].items():
        assert trial.steps(mode) == steps
    for saved in meta["saved_steps"]:
        assert trial.mode_of(saved["global_step"]) == (ModeKeys[saved["mode"]], saved["mode_step"])
    assert set(trial.tensor_names()) == set(meta["tensor_names"]) | set(meta["shape_only_tensor_names"])
    collections = trial.collections()
    for name, spec in meta["collections"].items():
        assert list(collections[name].include_regex) == spec["include_regex"]
    assert trial.tensor_names(collection="gradients") == sorted(n for n in meta["tensor_names"] if n.startswith("gradient/"))


def test_every_value_matches_what_torch_had(trial, expected):
    _, values = expected
    checked = 0
    for key, want in values.items():
        mode, mode_step, name = key.split("/", 2)
        got = trial.tensor(name).value(int(mode_step), mode=mode)
        if parse_reduction_tensor_name(name):
            np.testing.assert_allclose(np.asarray(got, dtype=np.float64).reshape(-1), np.asarray(want, dtype=np.float64).reshape(-1), rtol=1e-5, err_msg=key)
        else:
            assert got.shape == want.shape, key
            if want.dtype.kind == "U":
                assert got.tolist() == want.tolist(), key
            else:
                assert got.dtype == want.dtype, key
                assert got.tobytes() == want.tobytes(), key
        checked += 1
    assert checked == len(values) > 250


def test_reductions_through_the_tensor_api(trial, expected):
    _, values = expected
    for key, want in values.items():
        mode, mode_step, name = key.split("/", 2)
        parsed = parse_reduction_tensor_name(name)
        if not parsed:
            continue
        tensor, reduction, is_abs = parsed
        got = trial.tensor(tensor).reduction_value(int(mode_step), reduction, mode=mode, abs=is_abs)
        assert got == pytest.approx(float(np.asarray(want).reshape(-1)[0]), rel=1e-5), key


def test_shape_only_tensors(trial, expected):
    meta, _ = expected
    for key, shape in meta["shapes"].items():
        mode, mode_step, name = key.split("/", 2)
        assert trial.tensor(name).shape(int(mode_step), mode=mode) == tuple(shape)
        assert not trial.tensor(name).has_value(int(mode_step), mode=mode)


def test_placeholder_crc_is_accepted_only_on_legacy_jobs(tmp_path, trial):
    """Our own jobs verify real payload CRCs: the same placeholder there is corruption."""
    import shutil

    from stepscope.exceptions import CorruptRecord

    copy = tmp_path / "job"
    shutil.copytree(FIXTURE / "trial", copy)
    collections = copy / "collections/000000000/worker_0_collections.json"
    data = json.loads(collections.read_text())
    data["_meta"]["writer"] = "stepscope 0.1.0"
    collections.write_text(json.dumps(data))
    with pytest.raises(CorruptRecord, match="payload CRC mismatch"):
        create_trial(str(copy)).tensor("Sequential_0.weight").value(0)
    assert trial.tensor("Sequential_0.weight").value(0).shape == (3, 4)
