"""`stepscope diff` on real torch jobs and on torch.profiler's own traces: a planted slow
data phase, an added operator and an exploding learning rate each show where they should."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from torch import nn

from stepscope.cli import main
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.diff import compare, format_text
from stepscope_torch import Hook

STEPS = 24
SLEEP_S = 0.05


def _train(out, *, sleep_s: float = 0.0, sigmoid: bool = False, lr: float = 0.05) -> list[float]:
    """Train; each iteration's wall time in ms, by the loop's own clock."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)]
    if sigmoid:
        layers.insert(2, nn.Sigmoid())
    model = nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(STEPS)]
    with Hook(str(out), save_config=SaveConfig(save_interval=4), include_collections=["weights", "gradients", "losses"],
              profiler_config=ProfilerConfig(detailed_windows=[(8, 2)])) as hook:
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.register_optimizer(optimizer)
        times = []
        for x, y in batches:
            started = time.perf_counter()
            if sleep_s:
                time.sleep(sleep_s)  # a slow data loader: inside the step, before forward
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            times.append((time.perf_counter() - started) * 1000)
    return times


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    # One intra-op thread: on a busy machine two threads of a tiny model wait on each other
    # for tens of ms at random steps, which would drown the planted 50 ms.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _jobs(tmp_path_factory.mktemp("diff"))
    finally:
        torch.set_num_threads(threads)


def _jobs(root):
    paths = {name: root / name for name in ("base", "again", "slow", "sigmoid", "explode")}
    _train(paths["base"])
    _train(paths["again"])
    paths["slow_loop_ms"] = _train(paths["slow"], sleep_s=SLEEP_S)
    _train(paths["sigmoid"], sigmoid=True)
    _train(paths["explode"], lr=1e4)
    return paths


def _row(diff, section, key):
    rows = [r for r in diff.section(section).rows if r.key == key]
    assert rows, f"{key!r} not in {[r.key for r in diff.section(section).rows]}"
    return rows[0]


def test_slow_data_phase_shows_in_steps_and_phases(jobs):
    diff = compare(str(jobs["base"]), str(jobs["slow"]), rules="none")
    median = _row(diff, "steps", "TRAIN median step")
    assert median.b - median.a >= 0.8 * SLEEP_S * 1000, median  # the sleep, in ms
    assert median.status == "changed"
    phases = {r.key: r for r in diff.section("phases").rows}
    grown = max(phases.values(), key=lambda r: (r.b or 0) - (r.a or 0))
    assert grown.key == "data" and grown.b >= 0.8 * SLEEP_S * 1000
    # the hook's median step against the loop's own clock (each iteration, perf_counter)
    ours = float(np.median(jobs["slow_loop_ms"][2:]))
    assert abs(median.b - ours) <= max(0.25 * ours, 3.0), (median.b, ours)


def test_added_operator_is_new_and_identical_runs_show_no_change(jobs):
    diff = compare(str(jobs["base"]), str(jobs["sigmoid"]), rules="none", top=200)
    assert _row(diff, "operators", "aten::sigmoid").status == "new"
    same = compare(str(jobs["base"]), str(jobs["again"]), rules="none")
    tensors = same.section("tensors").rows
    assert tensors and all(r.status == "same" and r.a == r.b for r in tensors)  # same seed, same values
    assert "aten::sigmoid" not in {r.key for r in same.section("operators").rows}


def test_tensor_norms_and_rule_regression(jobs, capsys):
    diff = compare(str(jobs["base"]), str(jobs["explode"]), rules="run")
    weight = next(r for r in diff.section("tensors").rows if r.key.startswith("0.weight @ TRAIN step"))
    step = int(weight.key.rsplit(" ", 1)[1])
    from stepscope import create_trial

    for job, figure in ((jobs["base"], weight.a), (jobs["explode"], weight.b)):
        value = create_trial(str(job)).tensor("0.weight").value(step).astype(np.float64)
        assert figure == pytest.approx(float(np.sqrt((value**2).sum())), nan_ok=True)
    assert not np.isfinite(weight.b) or weight.b > 10 * weight.a  # lr 1e4: blown up (or NaN)
    assert diff.section("tensors").rows[0].key.split(" @ ")[0] in {"0.weight", "2.weight", "0.bias", "2.bias"} | {
        f"gradient/{n}" for n in ("0.weight", "2.weight", "0.bias", "2.bias")}
    fired = [r for r in diff.section("rules").rows if r.b == "fired"]
    assert fired and any(r.a != "fired" for r in fired)
    assert main(["diff", str(jobs["base"]), str(jobs["explode"]), "--fail-on-new-findings", "--sections", "rules"]) == 1
    assert "regression:" in capsys.readouterr().err
    assert main(["diff", str(jobs["base"]), str(jobs["again"]), "--fail-on-new-findings", "--sections", "rules,steps"]) == 0


def test_cli_gate_json_and_bad_input(jobs, capsys, tmp_path):
    assert main(["diff", str(jobs["base"]), str(jobs["slow"]), "--rules", "none", "--fail-if-slower", "10"]) == 1
    capsys.readouterr()
    assert main(["diff", str(jobs["base"]), str(jobs["slow"]), "--rules", "none", "--json", "--sections", "steps,phases"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in body["sections"]] == ["steps", "phases"]
    assert any(r["key"] == "data" and r["status"] == "changed" for r in body["sections"][1]["rows"])
    assert main(["diff", str(jobs["base"]), str(tmp_path / "nothing-here")]) == 2
    assert "nothing-here" in capsys.readouterr().err
    assert main(["diff", str(jobs["base"]), str(jobs["slow"]), "--sections", "steps,bogus"]) == 2
    assert "bogus" in capsys.readouterr().err


def test_two_torch_profiler_trace_folders(tmp_path):
    """Traces written by torch.profiler itself (no stepscope hook): the trace sections compare."""
    for name, width in (("narrow", 8), ("wide", 256)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 4))
        x = torch.randn(32, 64)
        handler = torch.profiler.tensorboard_trace_handler(str(tmp_path / name))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    schedule=torch.profiler.schedule(wait=0, warmup=1, active=3), on_trace_ready=handler) as prof:
            for _ in range(4):
                model(x).sum().backward()
                prof.step()
    diff = compare(str(tmp_path / "narrow"), str(tmp_path / "wide"), rules="none")
    assert _row(diff, "steps", "traced steps").a == 3
    assert "needs a job" in diff.section("system").note
    ops = {r.key for r in diff.section("operators").rows}
    assert "aten::addmm" in ops or "aten::mm" in ops
    text = format_text(diff)
    assert "CPU operators" in text and "A: " in text
