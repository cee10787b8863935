"""smdebug hook configurations keep their meaning: under each JSON configuration of
fixtures/smdebug_configs/configs.json, stepscope's `Hook.from_json` saves the same tensors
at the same steps of each mode, with the same reductions, as smdebug 1.0.34 did running the
same training (recorded by smdebug itself with its own reader: make_fixture.py there),
and for two of them the same values.

Names differ in one documented way (docs/pytorch.md, "Names and collections"): smdebug puts
the model's class name before a parameter's (`Net_fc1.weight`), stepscope uses
`named_parameters()` (`fc1.weight`)."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import numpy as np
import pytest

from stepscope import create_trial
from stepscope.config import ProfilerConfig
from stepscope_torch import Hook

FIXTURE = Path(__file__).parent / "fixtures" / "smdebug_configs"
CONFIGS = json.loads((FIXTURE / "configs.json").read_text())
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
_REDUCTION = re.compile(r"^smdebug/reductions/(abs_)?([a-z0-9]+)/(.+)$")


def _training():
    return runpy.run_path(str(FIXTURE / "training.py"))


def _smdebug_name(name: str) -> str:
    # (a parameter's name only: both name the top-level module's inputs `Net_input_0`)
    return re.sub(r"(^|/)Net_(?=[\w.]+\.)", r"\1", name)


def _saved(job: str) -> tuple[dict[str, list[int]], dict[str, list[list]]]:
    """What smdebug's reader lists of `job`: each tensor's steps per mode (a tensor saved
    only as reductions under its own name), and the reductions saved with it."""
    trial = create_trial(job)
    steps: dict[str, set[int]] = {}
    reductions: dict[str, set[tuple[str, bool]]] = {}
    for name in trial.tensor_names():
        match = _REDUCTION.match(name)
        base = match.group(3) if match else name
        for mode in ("TRAIN", "EVAL"):
            found = trial.tensor(name).steps(mode=mode)
            if found:
                steps.setdefault(f"{base}|{mode}", set()).update(found)
                if match:
                    reductions.setdefault(f"{base}|{mode}", set()).add((match.group(2), bool(match.group(1))))
    return {k: sorted(v) for k, v in steps.items()}, {k: sorted([list(r) for r in v]) for k, v in reductions.items()}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_an_smdebug_configuration_saves_what_smdebug_saved(name, tmp_path):
    out = tmp_path / "job"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**CONFIGS[name], "LocalPath": str(out)}))
    hook = Hook.from_json(str(config), profiler_config=ProfilerConfig.disabled())

    def register(model, loss_fn):
        hook.register_module(model)
        hook.register_loss(loss_fn)

    _training()["train"](register, hook.set_mode)
    hook.close()
    steps, reductions = _saved(str(out))
    expected = EXPECTED[name]
    assert steps == {_smdebug_name(k): v for k, v in expected["steps"].items()}
    assert reductions == {_smdebug_name(k): v for k, v in expected["reductions"].items()}
    # The values smdebug saved, where the fixture has them: the raw ones bit for bit (the
    # same torch, the same point of the step), the reductions to float32's precision
    # (smdebug reduces in float32 with torch, stepscope in float64).
    trial = create_trial(str(out))
    for key, value in expected.get("values", {}).items():
        tensor, mode, step, *reduction = _smdebug_name(key).split("|")
        if reduction:
            is_abs = reduction[0].startswith("abs_")
            saved = trial.tensor(tensor).reduction_value(int(step), reduction[0].removeprefix("abs_"), abs=is_abs, mode=mode)
            assert saved == pytest.approx(value, rel=1e-6, abs=1e-12), key
        else:
            np.testing.assert_array_equal(trial.tensor(tensor).value(int(step), mode=mode).astype(np.float64).ravel(), value, err_msg=key)
