"""Charts a person can read, in a real headless Chromium: a compile-like first step is drawn
apart from the step-time histogram (which keeps more than one bin) and the step chart goes
log; legends sit outside the plot area; a CPU-only job's GPU section is one line and its
profiled window's CPU operators show (from a real torch.profiler trace); a rule that could
not judge wears a badge unlike "ok". Screenshots land in artifacts/ui/."""

from __future__ import annotations

import time

import numpy as np
import pytest

from stepscope.trial import create_trial

from .browser import app_in_browser, chromium_paths, screenshot, sign_in, wait_for
from .conftest import train_deep_mlp, write_profiler_job

pytestmark = pytest.mark.heavy


def _cpu_trace(path) -> None:
    """A real torch.profiler trace of a few CPU training steps, shapes and stacks recorded."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_stack=True) as prof:
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            optimizer.step()
            prof.step()
    prof.export_chrome_trace(str(path))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    chromium_paths()
    root = tmp_path_factory.mktemp("store")
    # A 12-layer MLP, weights saved every step: 12 update-ratio series for one chart.
    train_deep_mlp(str(root / "team-a" / "deep"), layers=12, width=8, activation="ReLU", steps=6, batch=16, collections=["weights", "losses"])
    rng = np.random.default_rng(4)
    write_profiler_job(root / "team-a" / "compiled", durations_ms=[8300.0] + list(10 + rng.random(120)))
    cpu_job = write_profiler_job(root / "team-a" / "cpu-only", steps=6)
    _cpu_trace(cpu_job / "profiler-output/framework/pytorch/detailed/rank0/window_000000.pt.trace.json")
    with app_in_browser(root, tmp_path_factory.mktemp("db"), {"alice": ["team-a"]}) as (server, driver):
        sign_in(driver, server.url)
        yield server, driver, root


def _chart(driver, chart_id: str):
    return wait_for(lambda: driver.execute_script("return (window.stepscope && window.stepscope.charts[arguments[0]]) || null", chart_id), what=f"chart {chart_id}")


def _rect(element) -> tuple[float, float, float, float]:
    r = element.rect
    return r["x"], r["y"], r["x"] + r["width"], r["y"] + r["height"]


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_a_compile_step_is_drawn_apart_and_the_histogram_keeps_its_bins(served):
    server, driver, root = served
    driver.get(f"{server.url}/jobs/team-a/compiled#dashboard")
    histogram = _chart(driver, "step-histogram")
    durations = create_trial(str(root / "team-a" / "compiled")).profiler.step_timeline().query("phase == 'step'").sort_values("start_ns")["duration_ms"].to_numpy()
    assert durations[0] == pytest.approx(8300.0)
    counts, edges = np.histogram(durations[1:], bins=30)  # every step but the compile step
    assert histogram["counts"] == counts.tolist() and sum(c > 0 for c in histogram["counts"]) > 1
    np.testing.assert_allclose(histogram["edges"], edges)
    assert [a["name"] for a in histogram["apart"]] == ["TRAIN step 0"]
    note = driver.find_element("id", "step-histogram-apart").text
    assert "1 step drawn apart" in note and "8.3 s (TRAIN step 0)" in note
    summary = driver.find_element("id", "step-histogram-summary").text
    assert "max 8.30 s" in summary  # the summary still counts every step
    steps = _chart(driver, "steps:algo-1/rank0/TRAIN")
    assert steps["logY"] is True
    # every chart's legend lies outside its plot area
    plots = driver.find_elements("css selector", ".uplot")
    assert plots
    for plot in plots:
        area = _rect(plot.find_element("css selector", ".u-over"))
        for legend in plot.find_elements("css selector", ".u-legend"):
            assert not _overlap(area, _rect(legend))
    screenshot(driver, "20-compile-step-histogram")


def test_a_cpu_only_job_shows_its_cpu_operators_and_one_line_for_the_gpu_tables(served):
    pytest.importorskip("pyarrow")
    server, driver, root = served
    driver.get(f"{server.url}/jobs/team-a/cpu-only#dashboard")
    table = _chart(driver, "gpu-table:CPU operators (inclusive time, with self time)")
    traces = create_trial(str(root / "team-a" / "cpu-only")).profiler.traces
    expected = traces.cpu_ops(k=10)
    assert [r[table["columns"].index("name")] for r in table["rows"]] == expected["name"].tolist()
    assert any("aten::" in r[table["columns"].index("name")] for r in table["rows"])
    empty = wait_for(lambda: driver.find_element("id", "gpu-empty"), what="one line for the empty tables").text
    assert "Top kernels by time" in empty and "GPU activity" in empty
    assert driver.find_element("id", "gpu-none").is_displayed()
    headings = [h.text for h in driver.find_elements("css selector", "#gpu h4")]
    assert "Top kernels by time" not in headings and "CPU operators (inclusive time, with self time)" in headings
    # a rule that could not judge: its badge is not the green "ok" one
    wait_for(lambda: driver.find_elements("css selector", "#rules-list li.rule"), what="rules")
    judged = driver.find_element("id", "rules-judged").text
    assert " rules could judge" in judged
    nodata = driver.find_elements("css selector", "#rules-list .status.nodata")
    ok = driver.find_elements("css selector", "#rules-list .status.finished")
    if nodata and ok:
        style = lambda e, p: driver.execute_script("return getComputedStyle(arguments[0])[arguments[1]]", e, p)  # noqa: E731
        assert style(nodata[0], "backgroundColor") != style(ok[0], "backgroundColor")
        assert style(nodata[0], "borderStyle") == "dashed"
    screenshot(driver, "21-cpu-only-job")


def test_the_steps_table_shows_wall_clock_times_not_epoch_seconds(served):
    server, driver, root = served
    driver.get(f"{server.url}/jobs/team-a/compiled#stats")
    # the first rows come with the page, then the server's page replaces them
    wait_for(lambda: driver.find_elements("css selector", "#stats-section-steps .table-scroll[data-matched]"), what="steps table from the server")
    cell = wait_for(lambda: driver.find_element("css selector", "#stats-steps tbody tr td:nth-child(5)"), what="steps table")
    raw = float(cell.get_attribute("data-value"))
    assert raw > 1e9 and cell.text.endswith(" UTC") and cell.text.startswith("2023-11-14 22:13:")


def test_the_operator_views_of_a_real_trace_are_on_the_statistics_tab(served):
    """Operators by name, by input shapes and by call stack from the CPU job's real
    torch.profiler trace, the same rows as stepscope.traces.details gives."""
    pytest.importorskip("pyarrow")
    from stepscope.store import open_store
    from stepscope.traces import details

    server, driver, root = served
    driver.get(f"{server.url}/jobs/team-a/cpu-only#stats")
    wait_for(lambda: driver.find_elements("css selector", "#stats-section-operators_by_shapes .table-scroll[data-matched]"), what="operators by shapes")
    job = root / "team-a" / "cpu-only"
    events = details.read_events(open_store(str(job)), "profiler-output/framework/pytorch/detailed/rank0/window_000000.pt.trace.json")
    expected = details.operator_table(events, "shapes")
    table = driver.find_element("id", "stats-operators_by_shapes")
    header = [th.text for th in table.find_elements("css selector", "thead th")]
    first = [td.get_attribute("data-value") for td in table.find_elements("css selector", "tbody tr:first-child td")]
    assert header[:3] == ["name", "input_shapes", "calls"]
    assert first[0] == expected["name"].iloc[0] and first[1] == expected["input_shapes"].iloc[0] and int(first[2]) == expected["calls"].iloc[0]
    stacks = [td.get_attribute("data-value") for td in driver.find_elements("css selector", "#stats-operators tbody td:last-child")]
    assert any("_cpu_trace" in s for s in stacks)  # the call stack names this test's function that trained
    assert not driver.find_elements("id", "stats-kernels_by_op")  # no kernels on CPU: no empty table
    empty = driver.find_element("id", "stats-empty").text  # the engine's GPU tables: one line
    assert "GPU kernels" in empty and "Memory operations" in empty and not driver.find_elements("id", "stats-kernels")
    screenshot(driver, "22-operator-views")


def test_a_chart_of_many_series_names_the_top_eight_in_a_legend_below_the_plot(served):
    server, driver, root = served
    driver.get(f"{server.url}/jobs/team-a/deep#health")
    chart = _chart(driver, "update-ratios")
    series = chart["series"]
    assert len(series) == 12
    top = sorted(series, key=lambda name: -max(v for v in series[name] if v is not None))[:8]
    assert sorted(chart["named"]) == sorted(top)
    note = wait_for(lambda: driver.find_element("id", "update-ratios-note"), what="legend note").text
    assert "legend: top 8 of 12 by max" in note
    plot = driver.find_element("css selector", "#update-ratios .uplot")
    shown = [row for row in plot.find_elements("css selector", ".u-legend .u-series") if row.is_displayed()]
    assert len(shown) == 1 + 8  # the x value and the eight named series
    area = _rect(plot.find_element("css selector", ".u-over"))
    assert not _overlap(area, _rect(plot.find_element("css selector", ".u-legend")))
    screenshot(driver, "23-capped-legend")


@pytest.mark.parametrize(("samples", "decimals"), [(1, 1), (2, 1), (20, 0)])
def test_a_time_axis_spans_its_samples_with_ticks_that_tell_apart(served, samples, decimals):
    # One system sample (a short job) drew its point at the left edge of an axis years long
    # with every tick reading 00:00:00; two samples 0.5 s apart had six ticks reading the
    # same second. The axis now spans the samples (one: a second either side) and its ticks
    # carry the decimals that tell them apart.
    server, driver, root = served
    name = f"sampled-{samples}"
    write_profiler_job(root / "team-a" / name, steps=4, samples=samples)
    driver.get(f"{server.url}/jobs/team-a/{name}#dashboard")
    chart = wait_for(lambda: (c := _chart(driver, "system:algo-1")) and c.get("xTicks") and c.get("xRange") and c, what="drawn system chart")
    first, last = chart["x"][0], chart["x"][-1]
    low, high = chart["xRange"]
    assert low <= first and last <= high and high - low <= max(2.0, 1.5 * (last - first)), (chart["xRange"], chart["x"])
    ticks = [t for t in chart["xTicks"] if t]
    assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), ticks
    assert all(len(t) == (8 if not decimals else 9 + decimals) for t in ticks), ticks
    start = time.strftime("%H:%M", time.gmtime(first))
    assert all(t.startswith(start) or t.startswith(time.strftime("%H:%M", time.gmtime(last))) for t in ticks), (ticks, start)
    screenshot(driver, f"system-chart-{samples}-samples")


def test_a_loss_that_blew_up_says_how_many_values_are_not_drawn(served):
    from stepscope.capture.collection_manager import CollectionManager
    from stepscope.capture.writer import Writer
    from stepscope.modes import ModeKeys

    server, driver, root = served
    with Writer(str(root / "team-a" / "blown")) as writer:
        writer.write_collections(CollectionManager(builtin_regexes={"losses": ["loss"]}).dumps(1))
        for step, loss in enumerate([1.5, 2.0e6, float("inf"), float("nan"), float("nan")]):
            writer.write_step(step, ModeKeys.TRAIN, step, {"loss": np.float32(loss)})
    driver.get(f"{server.url}/jobs/team-a/blown#health")
    note = wait_for(lambda: driver.find_elements("css selector", ".non-finite-note"), what="the NaN/inf note")[0]
    assert note.text == "3 values not drawn (2 NaN, 1 infinite), the first at global step 2"
    screenshot(driver, "health-loss-blew-up")
