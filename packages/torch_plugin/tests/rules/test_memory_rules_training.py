"""The memory rules on real CPU training with stepscope's torch profiling windows
(profile_memory=True by default): a planted leak (a list keeping every step's activations)
is caught by MemoryGrowth, a planted near-OOM (a batch that nearly fills a fake device
limit) by MemoryNearLimit, and the healthy job gives no memory finding. Expected values
come from the traces' raw [memory] events."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from stepscope.config import ProfilerConfig
from stepscope.rules.memory import MEMORY_RULES, MemoryGrowth, MemoryNearLimit
from stepscope.store import open_store
from stepscope_torch.profiling import create_profiling

pytest.importorskip("pyarrow")
pytestmark = pytest.mark.heavy

FAKE_LIMIT = 20 << 20  # the "device" of the near-OOM job: 20 MiB
WINDOW = (2, 5)  # profiled steps 2..6: after Adam made its state at step 0


def _train(root, batch: int, leak: bool, steps: int = 8) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    config = ProfilerConfig(detailed_windows=[WINDOW])
    assert config.profile_memory  # the default: windows record allocator events
    profiling = create_profiling(config, open_store(str(root)))
    assert profiling is not None
    kept = []
    for step in range(steps):
        profiling.step_started(step)
        x, y = torch.randn(batch, 256), torch.randint(0, 10, (batch,))
        hidden = model[:2](x)
        loss = torch.nn.functional.cross_entropy(model[2:](hidden), y)
        if leak:
            kept.append(hidden)  # the leak: every step's activations stay referenced
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        profiling.step_ended(step)
    profiling.close()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    made = {}
    for name, batch, leak in (("healthy", 32, False), ("near_oom", 2304, False), ("leak", 256, True)):
        root = tmp_path_factory.mktemp(name)
        _train(root, batch, leak)
        made[name] = root
    return made


def _raw_memory(root):
    (trace,) = root.glob("profiler-output/framework/pytorch/detailed/rank0/*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")}
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    return steps, memory


def test_the_healthy_job_gives_no_memory_finding(jobs):
    for name, rule in MEMORY_RULES.items():
        params = {"limit_bytes": FAKE_LIMIT} if rule is MemoryNearLimit else {}
        report = rule(str(jobs["healthy"]), **params).run()
        assert not report.fired, (name, [e.message for e in report.evidence])
    judged = MemoryNearLimit(str(jobs["healthy"]), limit_bytes=FAKE_LIMIT).run()
    assert judged.statistics["steps_judged"] == WINDOW[1] and judged.statistics["highest_share"] < 0.5


def test_near_oom_batch_is_caught_at_every_profiled_step(jobs):
    report = MemoryNearLimit(str(jobs["near_oom"]), limit_bytes=FAKE_LIMIT).run()
    steps, memory = _raw_memory(jobs["near_oom"])
    expected = {}
    for step, (start, end) in steps.items():
        peak = max(e["args"]["Total Allocated"] for e in memory if start <= e["ts"] < end)
        expected[step] = peak / FAKE_LIMIT
    assert all(share > 0.9 for share in expected.values())
    assert {e.step: e.value for e in report.evidence} == pytest.approx(expected)
    assert all(e.data["device"] == "cpu" and e.data["op"].startswith("aten::") for e in report.evidence)
    # Same job, the growth rule: a big batch is not a leak.
    assert not MemoryGrowth(str(jobs["near_oom"])).run().fired


def test_the_leak_is_caught_with_the_bytes_each_step_keeps(jobs):
    report = MemoryGrowth(str(jobs["leak"])).run()
    assert report.fired and report.violations == 1
    steps, memory = _raw_memory(jobs["leak"])
    judged = sorted(steps)[1:]
    grown = 0
    for step in judged:
        start, end = steps[step]
        inside = [e["args"] for e in memory if start <= e["ts"] < end]
        grown += inside[-1]["Total Allocated"] - (inside[0]["Total Allocated"] - inside[0]["Bytes"])
    evidence = report.evidence[0]
    assert evidence.value == grown == len(judged) * 256 * 512 * 4  # one (256, 512) float32 activation a step
    assert evidence.data["outliving_bytes"] >= grown
    assert "Free the references" in " ".join(MemoryGrowth.explanation.advice)
