"""Rule reports (every JSON shape the engines write) as the report's findings."""

from __future__ import annotations

from stepscope.report.findings import Finding, ranked

TENSOR_REPORT = {
    "rule": "ExplodingTensor", "rule_class": "ExplodingTensor", "parameters": {"only_nan": False}, "fired": True,
    "fired_steps": [12, 13], "violations": 3, "details": [{"step": 12, "message": "loss: 1 NaN"}], "steps_evaluated": 20,
    "tensors_inspected": 4, "errors": [], "status": "fired",
}
PROFILER_REPORT = {"rule": "StepOutlier", "fired": False, "violations": 2, "datapoints": 30, "details": {"outliers": [{"step": 4}]}, "parameters": {"stddev": 3}}
MODEL_REPORT = {
    "rule": "LossNotDecreasing", "rule_class": "LossNotDecreasing", "kind": "tensor", "status": "fired", "violations": 1,
    "parameters": {"num_steps": 10}, "fired_steps": [40],
    "evidence": [{"where": "TRAIN step 40 (global 44)", "message": "loss 1.2 >= 1.1", "step": 44}],
    "explanation": {"definition": "The loss stopped going down.", "advice": ["Lower the learning rate."]},
    "statistics": {"windows": 3},
}


def test_tensor_rule_report():
    finding = Finding.from_json(TENSOR_REPORT)
    assert finding.fired and finding.kind == "tensor" and finding.fired_steps == (12, 13)
    assert finding.evidence[0].where == "step 12" and finding.evidence[0].message == "loss: 1 NaN"
    assert finding.summary == "3 violation(s): loss: 1 NaN"


def test_profiler_rule_report_keeps_its_statistics():
    finding = Finding.from_json(PROFILER_REPORT)
    assert finding.status == "ok" and finding.kind == "job" and finding.statistics["outliers"] == [{"step": 4}]
    assert finding.summary == "ok over 30 datapoint(s)"
    empty = Finding.from_json({"rule": "CPUBottleneck", "fired": False, "violations": 0, "datapoints": 0, "details": {}})
    assert empty.status == "no data"
    broken = Finding.from_json({"rule": "X", "fired": False, "error": "ValueError('bad')"})
    assert broken.status == "error" and broken.summary == "ValueError('bad')"


def test_rule_model_report_with_evidence_and_advice():
    finding = Finding.from_json(MODEL_REPORT)
    assert finding.advice == ("Lower the learning rate.",) and finding.definition == "The loss stopped going down."
    assert finding.evidence[0].where == "TRAIN step 40 (global 44)" and finding.statistics == {"windows": 3}


def test_ranking_puts_fired_first_by_violations():
    findings = [Finding.from_json(r) for r in (PROFILER_REPORT, MODEL_REPORT, TENSOR_REPORT)]
    assert [f.rule for f in ranked(findings)] == ["ExplodingTensor", "LossNotDecreasing", "StepOutlier"]


def test_evidence_keeps_tensor_value_and_threshold():
    from stepscope.report.context import ReportContext
    from stepscope.report.sections import rules as rules_section

    body = dict(MODEL_REPORT, evidence=[{"where": "TRAIN step 40 (global 44)", "message": "m", "step": 44, "tensor": "loss", "value": 1.2, "threshold": 1.1}])
    finding = Finding.from_json(body)
    assert (finding.evidence[0].tensor, finding.evidence[0].value, finding.evidence[0].threshold) == ("loss", 1.2, 1.1)
    section = rules_section.build(ReportContext(None, [finding]))  # type: ignore[arg-type]
    assert section.table("evidence-LossNotDecreasing").rows == (("TRAIN step 40 (global 44)", "loss", 1.2, 1.1, "m"),)
