"""The fast subset of the public-scripts suite (the full one: bench/bench_public_scripts.py):
a few of the programs modelled on public training scripts, trained for real on CPU with
the README's quick-start capture, healthy and with one planted fault each, judged by the
default `stepscope check` rule set. Healthy: no finding. Faulty: caught by a rule the
catalogue expects for that fault."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("stepscope_torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from public_scripts import catalogue, runner  # noqa: E402

FAST = [p for p in catalogue.PROGRAMS if p.fast_fault]
CASES = [(p.name, None) for p in FAST] + [(p.name, p.fast_fault) for p in FAST]

# Cases that fail with today's rules, each with the reason (remove once fixed).
KNOWN: dict[tuple[str, str | None], str] = {}


def test_the_catalogue_is_consistent():
    names = [p.name for p in catalogue.PROGRAMS]
    assert len(names) == len(set(names)) >= 12
    assert {p.framework for p in catalogue.PROGRAMS} == {"torch", "lightning", "hf", "keras"}
    for program in catalogue.PROGRAMS:
        assert program.faults and all(f in catalogue.FAULTS for f in program.faults), program
        assert callable(program.train())
    assert all(f.caught_by for f in catalogue.FAULTS.values())
    assert 3 <= len(FAST) <= 4
    assert len(catalogue.runs()) == sum(2 * (1 + len(p.faults)) for p in catalogue.PROGRAMS)


def test_judge_counts_a_finding_on_a_healthy_run_as_wrong():
    class Report:
        def __init__(self, rule, fired):
            self.rule, self.fired, self.status = rule, fired, "fired" if fired else "ok"

        def summary(self):
            return f"{self.rule} summary"

    healthy = catalogue.Run("torch_mnist", "quickstart", None)
    faulty = catalogue.Run("torch_mnist", "quickstart", "dead_relu")
    assert runner.judge(healthy, [Report("LossNotDecreasing", False)])["ok"]
    assert not runner.judge(healthy, [Report("Dataloader", True)])["ok"]
    assert not runner.judge(faulty, [Report("VanishingGradient", True)])["ok"]  # a consequence, not the fault
    verdict = runner.judge(faulty, [Report("DeadRelu", True), Report("AllZero", False)])
    assert verdict["ok"] and verdict["right"] == ["DeadRelu"] and verdict["statuses"] == {"DeadRelu": "fired", "AllZero": "ok"}


def _case_id(case) -> str:
    return f"{case[0]}-{case[1] or 'healthy'}"


def _params():
    for case in CASES:
        marks = [pytest.mark.xfail(reason=KNOWN[case], strict=False)] if case in KNOWN else []
        yield pytest.param(*case, id=_case_id(case), marks=marks)


@pytest.mark.heavy
@pytest.mark.parametrize(("program", "fault"), list(_params()))
def test_default_check_on_a_public_script(program, fault, tmp_path):
    if catalogue.by_name(program).framework == "keras":
        pytest.importorskip("stepscope_tf")
    if catalogue.by_name(program).framework == "hf":
        pytest.importorskip("transformers")
    run = catalogue.Run(program, "quickstart", fault)
    verdict = runner.train_and_judge(run, tmp_path / "job")
    if fault is None:
        assert verdict["fired"] == [], verdict["evidence"]
    else:
        assert verdict["right"], (verdict["fired"], verdict["evidence"])
        assert set(verdict["right"]) <= set(catalogue.FAULTS[fault].caught_by)
    assert verdict["ok"]
