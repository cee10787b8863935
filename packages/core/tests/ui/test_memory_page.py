"""The Memory page in a real headless Chromium, on a two-rank job of generated CUDA traces
with allocator events (one rank leaks, the other's activations are twice as large): the
per-rank peaks, the timeline per rank and device with the step starts, what was live at
the highest peak and the growth table equal what the trace engine computes; a job without
allocator events says what to record. A screenshot lands in artifacts/ui/."""

from __future__ import annotations

import pytest

from stepscope.trial import create_trial

from .browser import app_in_browser, chromium_paths, screenshot, sign_in, wait_for

pytest.importorskip("pyarrow")
pytestmark = pytest.mark.heavy

DETAILED = "profiler-output/framework/pytorch/detailed"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from stepscope.traces.synth import SynthSpec, write_trace

    chromium_paths()
    root = tmp_path_factory.mktemp("store")
    for rank in range(2):
        spec = SynthSpec(steps=4, ops_per_step=12, rank=rank, world_size=2, seed=9, memory=True, leak_bytes=(2 << 20) if rank == 0 else 0,
                         activation_bytes=(8 << 20) * (1 + rank))
        write_trace(spec, root / "team-a" / "mem" / f"{DETAILED}/rank{rank}/window.pt.trace.json.gz")
    write_trace(SynthSpec(steps=2), root / "team-a" / "nomem" / f"{DETAILED}/rank0/window.pt.trace.json.gz")
    for job in ("mem", "nomem"):
        (root / "team-a" / job / "training_job_end.ts").write_text("")
    with app_in_browser(root, tmp_path_factory.mktemp("db"), {"alice": ["team-a"]}) as (server, driver):
        yield server, driver, root


def _chart(driver, chart_id: str):
    return wait_for(lambda: driver.execute_script("return (window.stepscope && window.stepscope.charts[arguments[0]]) || null", chart_id), what=f"chart {chart_id}")


def test_memory_page_shows_the_engine_numbers(served):
    server, driver, root = served
    sign_in(driver, server.url)
    driver.get(f"{server.url}/jobs/team-a/mem#memory")
    traces = create_trial(str(root / "team-a" / "mem")).profiler.traces
    ranks = _chart(driver, "memory-table:ranks")
    expected = traces.memory_ranks()
    peak_column = ranks["columns"].index("peak_allocated_mib")
    assert [row[peak_column] for row in ranks["rows"]] == pytest.approx((expected["peak_allocated"] / (1 << 20)).tolist())
    for rank in (0, 1):
        line = _chart(driver, f"memory:rank {rank}:cuda:0")
        full = traces.memory_timeline(rank=rank)
        assert max(line["allocated"]) == pytest.approx(full["allocated"].max() / (1 << 20))
        assert line["steps"] == traces.step_spans(rank=rank)["step"].tolist() == [0, 1, 2, 3]
        assert len(line["t"]) == len(full)  # under the bound: every point
    peak = _chart(driver, "memory-table:peak")
    top = expected.loc[expected["peak_allocated"].idxmax()]
    live = traces.memory_peak(rank=int(top["rank"]), device=str(top["device"]))
    assert [row[0] for row in peak["rows"]] == live["op"].tolist()
    growth = _chart(driver, "memory-table:growth")
    outliving = growth["columns"].index("outliving_bytes")
    assert {row[0] for row in growth["rows"] if row[outliving] > 0} == {0}  # only rank 0 leaks
    assert driver.find_element("id", "tab-memory").get_attribute("class") == "active"
    assert len(driver.find_elements("css selector", "#view canvas")) >= 2  # the timelines were drawn
    screenshot(driver, "10-memory-page")


def test_a_job_without_allocator_events_says_what_to_record(served):
    server, driver, _ = served
    driver.get(f"{server.url}/jobs/team-a/nomem#memory")
    note = wait_for(lambda: driver.find_elements("css selector", "#memory-none p"), what="memory note")
    assert "profile_memory=True" in note[0].text
