"""The app in a real headless Chromium, on a job from a real (small) PyTorch training run
with a planted problem (learning rate 0: the weights never move, so WeightUpdateRatio
fires): log in, find the job, check the dashboard's and health page's chart numbers
against the trial's, see the finding, open and zoom the timeline, click an interval; a
running job's page updates by itself. Screenshots land in artifacts/ui/."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from stepscope.modes import ModeKeys
from stepscope.trial import create_trial
from stepscope.ui import bundle
from stepscope.ui.app import create_app
from stepscope.ui.jobs import JobStore
from stepscope.ui.users import UserDB

from .browser import REPO, LiveServer, chromium_paths, quit_browser, screenshot, start_browser, wait_for
from .conftest import PASSWORD, T0_NS, write_profiler_job

pytestmark = pytest.mark.heavy

STEPS = 30


def _train(out_dir: str) -> None:
    torch = pytest.importorskip("torch")
    from stepscope.config import ProfilerConfig, SaveConfig
    from stepscope_torch import Hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the planted problem
    loss_fn = torch.nn.CrossEntropyLoss()
    hook = Hook(out_dir, save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients", "losses"],
                profiler_config=ProfilerConfig(system_monitor=True, monitor_interval_ms=100, step_timeline=True))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(optimizer)
    generator = torch.Generator().manual_seed(1)
    try:
        for _ in range(STEPS):
            x, y = torch.randn(32, 8, generator=generator), torch.randint(0, 3, (32,), generator=generator)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
    finally:
        hook.close()


@pytest.fixture(scope="module")
def trained_store(tmp_path_factory):
    from stepscope.cli import main

    chromium_paths()  # skip before training when there is no browser
    root = tmp_path_factory.mktemp("store")
    job = root / "team-a" / "mlp-lr0"
    _train(str(job))
    assert main(["check", str(job), "--rule", "WeightUpdateRatio", "--rule", "StepOutlier", "--quiet"]) == 1
    return root


@pytest.fixture(scope="module")
def served(trained_store, tmp_path_factory):
    if bundle.missing():  # a checkout where nox has not built the bundle yet
        subprocess.run([sys.executable, str(REPO / "scripts" / "build_ui.py")], check=True)
    db = UserDB(tmp_path_factory.mktemp("db") / "users.db", argon2_memory_kib=256, argon2_time_cost=1)
    db.add_user("alice", PASSWORD, prefixes=["team-a"])
    db.add_user("root", PASSWORD, admin=True)
    server = LiveServer(create_app(JobStore(str(trained_store)), db))
    driver = start_browser()
    driver._stepscope_db = db
    yield server, driver, trained_store
    quit_browser(driver)
    server.stop()


def _login(driver, url: str, name: str = "alice") -> None:
    driver.get(url + "/")
    assert driver.current_url.endswith("/login")
    driver.find_element("id", "username").send_keys(name)
    driver.find_element("id", "password").send_keys(PASSWORD)
    driver.find_element("id", "login").click()
    wait_for(lambda: driver.find_elements("css selector", "#jobs-table tbody tr"), what="jobs list")


def _chart(driver, chart_id: str):
    return wait_for(lambda: driver.execute_script("return (window.stepscope && window.stepscope.charts[arguments[0]]) || null", chart_id), what=f"chart {chart_id}")


def test_browser_end_to_end(served):
    server, driver, root = served
    _login(driver, server.url)
    rows = driver.find_elements("css selector", "#jobs-table tbody tr")
    assert [r.get_attribute("data-job") for r in rows] == ["team-a/mlp-lr0"]
    assert "WeightUpdateRatio" in rows[0].text and "finished" in rows[0].text
    screenshot(driver, "01-jobs")

    trial = create_trial(str(root / "team-a" / "mlp-lr0"))
    timeline = trial.profiler.step_timeline()
    steps = timeline[(timeline["phase"] == "step") & (timeline["mode"] == "TRAIN")].sort_values("start_ns")

    # dashboard: step times and their histogram are the trial's numbers
    driver.find_element("css selector", '#jobs-table tr[data-job="team-a/mlp-lr0"] a').click()  # the list refreshes itself: look it up afresh
    key = f"{steps['node_id'].iloc[0]}/rank{steps['rank'].iloc[0]}/TRAIN"
    chart = _chart(driver, f"steps:{key}")
    assert chart["x"] == [int(s) for s in steps["step"]]
    np.testing.assert_allclose(chart["series"]["step time (ms)"], steps["duration_ms"].to_numpy(), rtol=1e-9)
    histogram = _chart(driver, "step-histogram")
    # the bins span every step but the far-out ones (a slow first step), each named beside the chart
    durations = steps["duration_ms"].to_numpy()
    q1, median, q3 = np.percentile(durations, [25, 50, 75])
    far = (durations > max(q3 + 3 * (q3 - q1), 2 * median)) | (durations < min(q1 - 3 * (q3 - q1), median / 2))
    far = far if far.sum() <= max(1, int(0.05 * len(durations))) else np.zeros_like(far)
    assert [a["value"] for a in histogram["apart"]] == pytest.approx(sorted(durations[far], key=lambda v: -abs(v - median)))
    counts, edges = np.histogram(durations[~far], bins=30)
    assert histogram["counts"] == counts.tolist()
    np.testing.assert_allclose(histogram["edges"], edges)
    system = trial.profiler.system_metrics()
    cpu = system[(system["dimension"] == "CPUUtilization") & (system["name"] == "total")].sort_values("timestamp")
    charts = driver.execute_script("return Object.keys(window.stepscope.charts).filter(k => k.startsWith('system:'))")
    drawn = system[system["dimension"].isin(["CPUUtilization", "GPUUtilization", "GPUMemoryUtilization", "MemoryUsedPercent"])]
    assert sorted(charts) == sorted(f"system:{n}" for n in drawn["node_id"].unique())  # the monitor's nodes, whatever it sampled
    if len(cpu) and len(system["timestamp"].unique()) <= 600:  # not resampled: the same samples (None where a sample has no CPU line)
        sys_chart = _chart(driver, f"system:{cpu['node_id'].iloc[0]}")
        shown = [(t, v) for t, v in zip(sys_chart["x"], sys_chart["series"]["CPU"]) if v is not None]
        np.testing.assert_allclose([t for t, _ in shown], cpu["timestamp"].to_numpy())
        np.testing.assert_allclose([v for _, v in shown], cpu["value"].to_numpy())
    rule = wait_for(lambda: driver.find_element("css selector", 'li[data-rule="WeightUpdateRatio"]'), what="rule finding")
    assert "fired" in rule.get_attribute("class")
    report = json.loads(trial.store.read("rule-output/WeightUpdateRatio.json"))
    advice = rule.find_element("css selector", ".advice").text
    assert report["explanation"]["advice"] and all(a in advice for a in report["explanation"]["advice"])
    # its evidence, opened, stays inside the rule's card (long names and messages wrap or scroll)
    edges = driver.execute_script(
        "const r = arguments[0]; const d = r.querySelector('details'); d.open = true;"
        "const t = d.querySelector('table.evidence').getBoundingClientRect(); const c = r.closest('.card').getBoundingClientRect();"
        "return [t.left, t.right, c.left, c.right]", rule)
    assert edges[2] <= edges[0] and edges[1] <= edges[3], edges
    screenshot(driver, "02-dashboard")

    # training health: the loss curve is the saved loss
    driver.execute_script("location.hash = '#health'")
    loss_name = [n for n in trial.tensor_names(collection="losses")][0]
    curve = _chart(driver, f"curve:{loss_name}:TRAIN")
    saved = trial.tensor(loss_name).values(mode=ModeKeys.TRAIN)
    assert curve["x"] == sorted(saved)
    np.testing.assert_allclose(curve["series"][loss_name], [float(saved[s]) for s in sorted(saved)], rtol=1e-6)
    norms = _chart(driver, "gradient-norms")
    name, step = norms["rows"][0], norms["columns"][-1]
    expected = float(np.linalg.norm(trial.tensor(name).value(step).ravel()))
    assert norms["values"][0][-1] == pytest.approx(expected, rel=1e-5)
    ratios = _chart(driver, "update-ratios")
    assert all(v == 0 for values in ratios["series"].values() for v in values if v is not None)  # lr 0: nothing moves
    wait_for(lambda: driver.execute_script("return window.stepscope.charts['tensor-histogram']"), what="tensor histogram")
    screenshot(driver, "03-health")

    # statistics: the steps table, sortable, with a CSV
    driver.execute_script("location.hash = '#stats'")
    # the first rows come with the page, then the server's page replaces them
    wait_for(lambda: driver.find_elements("css selector", "#stats-section-steps .table-scroll[data-matched]"), what="steps table from the server")
    table = driver.find_element("id", "stats-steps")
    assert len(table.find_elements("css selector", "tbody tr")) == len(timeline[timeline["phase"] == "step"])
    header = [th for th in table.find_elements("css selector", "thead th") if th.text == "duration_ms"][0]
    header.click()  # sorted on the server, longest first
    slowest = float(timeline[timeline["phase"] == "step"]["duration_ms"].max())
    wait_for(lambda: float(driver.find_element("css selector", "#stats-steps tbody tr td:nth-child(6)").get_attribute("data-value")) == slowest,
             what="sorted steps table")
    screenshot(driver, "04-stats")

    # timeline: opens, zooms with W, a click on an interval shows its details
    driver.execute_script("location.hash = '#timeline'")
    canvas = wait_for(lambda: driver.find_element("id", "timeline-canvas"), what="timeline canvas")
    wait_for(lambda: driver.execute_script("return window.stepscope.timeline && window.stepscope.timeline.loads >= 1"), what="timeline data")
    full = driver.execute_script("const s = window.stepscope.timeline; return s.t1 - s.t0")
    loads = driver.execute_script("return window.stepscope.timeline.loads")
    canvas.click()
    canvas.send_keys("www")
    # each key asks the server again; only the last answer is drawn
    wait_for(lambda: driver.execute_script("const s = window.stepscope.timeline; return s.loads > arguments[0] && !s.loading", loads), what="zoomed data")
    state = driver.execute_script("const s = window.stepscope.timeline; return [s.t1 - s.t0, s.data.t1 - s.data.t0]")
    assert state[0] == pytest.approx(full * 0.7 ** 3, rel=0.02) and state[1] == pytest.approx(state[0], rel=1e-6)
    screenshot(driver, "05-timeline-zoomed")
    # The job's span runs from the monitor's first sample to its last (the hook's start to
    # the end of its close): on a loaded machine a slow close leaves the steps outside the
    # middle that W zoomed into. Pan toward them (A/D) and zoom on (W) until a step or phase
    # is wide enough to click.
    wide = "const h = window.stepscope.timeline.hits.filter(h => h.kind === 'slice' && h.x1 - h.x0 > 6); return h.length ? h[0] : null"
    hit = driver.execute_script(wide)
    steps_middle = (int(timeline["start_ns"].min()) + int(timeline["end_ns"].max())) / 2
    for _ in range(30):
        if hit:
            break
        t0, t1, loads = driver.execute_script("const s = window.stepscope.timeline; return [s.t0, s.t1, s.loads]")
        offset = (steps_middle - (t0 + t1) / 2) / (t1 - t0)
        canvas.send_keys("w" if abs(offset) < 0.2 else "d" if offset > 0 else "a")
        wait_for(lambda before=loads: driver.execute_script("const s = window.stepscope.timeline; return s.loads > arguments[0] && !s.loading", before), what="moved view")
        hit = driver.execute_script(wide)
    assert hit, "no interval wide enough to click"
    size = canvas.size
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).move_to_element_with_offset(canvas, int((hit["x0"] + hit["x1"]) / 2 - size["width"] / 2),
                                                     int((hit["y0"] + hit["y1"]) / 2 - size["height"] / 2)).click().perform()
    selected = wait_for(lambda: driver.execute_script("return window.stepscope.timeline.selected"), what="selected interval")
    assert selected["name"] == hit["name"]
    row = timeline[(timeline["start_ns"] == int(selected["start_ns"])) & (timeline["name"] == selected["name"])]
    assert len(row) == 1 and int(row["step"].iloc[0]) == selected["step"]
    assert driver.find_element("id", "selected-name").text == hit["name"]
    href = driver.find_element("id", "open-perfetto").get_attribute("href")
    assert re.search(r"/perfetto\?start=\d+&end=\d+$", href)
    screenshot(driver, "06-timeline-details")
    severe = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert not severe, severe  # no script errors, no CSP violations


def test_live_job_page_updates(served, tmp_path_factory):
    """A running job: new steps published while the page is open appear without a reload."""
    from stepscope.profiler import TimelineWriter

    server, driver, root = served
    job = root / "team-a" / "running"
    write_profiler_job(job, steps=5, close=False, start_ns=T0_NS)
    driver.get(f"{server.url}/jobs/team-a/running#dashboard")
    chart = _chart(driver, "steps:algo-1/rank0/TRAIN")
    assert len(chart["x"]) == 5
    writer = TimelineWriter(job, node_id="algo-1", rank=0, framework="pytorch", flush_interval_s=3600)
    t = T0_NS + 10**9
    for step in range(5, 12):
        writer.add(f"Step {step}", t, t + 50_000_000, step=step, mode=ModeKeys.TRAIN, phase="step")
        t += 60_000_000
    writer.close()
    grown = wait_for(lambda: (lambda c: c if c and len(c["x"]) == 12 else None)(
        driver.execute_script("return window.stepscope.charts['steps:algo-1/rank0/TRAIN']")), timeout=20, what="live update")
    assert grown["x"] == list(range(12))
    screenshot(driver, "07-live-job")


def _click_hit(driver, canvas, hit) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    size = canvas.size
    ActionChains(driver).move_to_element_with_offset(canvas, int((hit["x0"] + hit["x1"]) / 2 - size["width"] / 2),
                                                     int((hit["y0"] + hit["y1"]) / 2 - size["height"] / 2)).click().perform()


def test_gpu_job_dashboard_and_kernel_launch(served):
    """A job with (generated) Kineto GPU traces: the trace engine's tables on the dashboard,
    and clicking a kernel on the timeline shows the runtime call that launched it."""
    pytest.importorskip("pyarrow")
    from stepscope.traces.synth import SynthSpec, write_trace

    server, driver, root = served
    job = root / "team-a" / "gpu"
    write_trace(SynthSpec(steps=3, ops_per_step=30, seed=7), job / "profiler-output/framework/pytorch/detailed/rank0/window_000000.pt.trace.json.gz")
    (job / "training_job_end.ts").write_text("")
    traces = create_trial(str(job)).profiler.traces
    driver.get(f"{server.url}/jobs/team-a/gpu#dashboard")
    top = _chart(driver, "gpu-table:Top kernels by time")
    expected = traces.top_kernels(k=10, by="time")
    assert [r[1] for r in top["rows"]] == expected["name"].tolist()
    pie = _chart(driver, "gpu-time:rank 0")
    active = traces.active_time().iloc[0]
    assert pie["idle"] == pytest.approx(active["idle_us"]) and pie["kernels"] == pytest.approx(active["kernel_us"])
    screenshot(driver, "08-gpu-dashboard")

    driver.execute_script("location.hash = '#timeline'")
    canvas = wait_for(lambda: driver.find_element("id", "timeline-canvas"), what="timeline canvas")
    wait_for(lambda: driver.execute_script("return window.stepscope.timeline && window.stepscope.timeline.data && !window.stepscope.timeline.loading"),
             what="timeline data")
    hit = driver.execute_script(
        "const h = window.stepscope.timeline.hits.filter(h => h.kind === 'slice' && h.lane.startsWith('g0-') && h.x1 - h.x0 > 6);"
        "return h.length ? h[Math.floor(h.length / 2)] : null")
    assert hit, "no kernel wide enough to click"
    _click_hit(driver, canvas, hit)
    selected = wait_for(lambda: driver.execute_script("const s = window.stepscope.timeline.selected; return s && s.launch ? s : null"), what="kernel details")
    assert selected["name"] == hit["name"] and selected["kind"] in ("kernel", "memcpy", "memset")
    launches = traces.launches()
    launch = launches[launches["correlation"] == selected["correlation"]].iloc[0]
    assert selected["launch"]["call"] == launch["launch_call"] and int(selected["launch"]["start_ns"]) == launch["launch_ts_ns"]
    assert launch["launch_call"] in driver.find_element("id", "selected-launch").text
    screenshot(driver, "09-timeline-kernel-launch")


def test_admin_manages_users_from_the_app(served):
    """Sign out, sign in as an administrator, add a user with a prefix and remove it again
    on the Users page; a wrong password is refused on the way."""
    server, driver, root = served
    db = driver._stepscope_db
    driver.get(server.url + "/")
    if driver.find_elements("css selector", "form.logout button"):
        driver.find_element("css selector", "form.logout button").click()
        wait_for(lambda: driver.current_url.endswith("/login"), what="signed out")
    driver.find_element("id", "username").send_keys("root")
    driver.find_element("id", "password").send_keys("not the password")
    driver.find_element("id", "login").click()
    error = wait_for(lambda: driver.find_elements("css selector", ".error"), what="login error")[0]
    assert "Wrong user name or password" in error.text
    driver.find_element("id", "username").clear()
    driver.find_element("id", "username").send_keys("root")
    driver.find_element("id", "password").send_keys(PASSWORD)
    driver.find_element("id", "login").click()
    wait_for(lambda: driver.find_elements("css selector", "#jobs-table tbody tr"), what="jobs list")
    driver.find_element("id", "admin-link").click()
    wait_for(lambda: driver.find_elements("css selector", '#users-list tr[data-user="alice"]'), what="users list")
    driver.find_element("id", "new-user-name").send_keys("carol")
    driver.find_element("id", "new-user-prefixes").send_keys("team-a, team-c")
    driver.find_element("id", "add-user").click()
    row = wait_for(lambda: driver.find_elements("css selector", '#users-list tr[data-user="carol"]'), what="new user row")[0]
    assert "team-a, team-c" in row.text
    password = driver.find_element("id", "admin-output").text.rsplit(": ", 1)[1]
    assert db.verify_password("carol", password).prefixes == ("team-a", "team-c")
    screenshot(driver, "10-admin-users")
    row.find_element("css selector", "button.danger").click()
    driver.switch_to.alert.accept()
    wait_for(lambda: not driver.find_elements("css selector", '#users-list tr[data-user="carol"]'), what="user removed")
    assert "carol" not in [u.name for u in db.users()]


def test_a_hostile_job_is_listed_with_what_was_skipped_and_the_others_still_read(served, tmp_path):
    """A job with one index file that is not JSON: the list shows the file the reader left
    out (on hover), and the good job's row and page are unaffected."""
    import shutil

    from stepscope.testing import hostile_jobs
    from stepscope.testing.app_probe import HOSTILE_FILES, write_job

    server, driver, root = served
    made = hostile_jobs.build("index_not_json", tmp_path / "case")
    shutil.move(str(made.job), str(root / "team-a" / "broken"))
    driver.get(server.url + "/")
    if driver.current_url.endswith("/login"):
        driver.find_element("id", "username").send_keys("alice")
        driver.find_element("id", "password").send_keys(PASSWORD)
        driver.find_element("id", "login").click()
    broken = wait_for(lambda: driver.find_elements("css selector", '#jobs-table tbody tr[data-job="team-a/broken"]'), what="the broken job's row")[0]
    skipped = broken.find_element("css selector", "span.skipped")
    assert skipped.text.strip() == "1 file(s) skipped" and skipped.get_attribute("title").startswith("index/")
    good = driver.find_element("css selector", '#jobs-table tbody tr[data-job="team-a/mlp-lr0"]')
    assert "finished" in good.text
    screenshot(driver, "11-skipped-file")
    # A job whose one rule report is a 100,000-deep JSON: its page names that file and
    # still shows the rules that could run.
    HOSTILE_FILES["rule_output_deeply_nested"](write_job(root / "team-a" / "bad-report"))
    driver.get(server.url + "/jobs/team-a/bad-report#dashboard")
    problem = wait_for(lambda: driver.find_elements("css selector", "#rules-list .rule-problem"), what="the unreadable report named")[0]
    assert "rule-output/StepOutlier.json" in problem.text
    assert driver.find_elements("css selector", "#rules-list li.rule")
    screenshot(driver, "12-unreadable-rule-report")


def _train_with_evaluation(out_dir: str) -> None:
    """A real torch loop: 6 TRAIN steps, 2 EVAL steps, 6 TRAIN steps; weights, losses and
    ReLU outputs saved at every step."""
    torch = pytest.importorskip("torch")
    from stepscope.config import ProfilerConfig, SaveConfig
    from stepscope_torch import Hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = torch.nn.CrossEntropyLoss()
    hook = Hook(out_dir, save_config=SaveConfig(save_interval=1), include_collections=["weights", "losses", "outputs"],
                profiler_config=ProfilerConfig.disabled())
    hook.register_module(model)
    hook.register_loss(loss_fn)
    generator = torch.Generator().manual_seed(1)

    def batch():
        return torch.randn(32, 8, generator=generator), torch.randint(0, 3, (32,), generator=generator)

    try:
        for phase in ("train", "eval", "train"):
            model.train(phase == "train")
            for _ in range(6 if phase == "train" else 2):
                x, y = batch()
                if phase == "train":
                    optimizer.zero_grad()
                    loss_fn(model(x), y).backward()
                    optimizer.step()
                else:
                    with torch.no_grad():
                        loss_fn(model(x), y)
    finally:
        hook.close()


def test_dom_figures_are_the_trials_rules_and_reports(served):
    """The numbers a person reads equal the trial's, the rule's and the report's for the same
    thing, on global steps with every series of one mode: the dashboard's outliers are
    StepOutlier's (6 steps over mean + 3 std, under its limit, are not marked), the last
    update ratio is numpy's on the saved weights and the report's, EVAL steps appear only
    in EVAL series."""
    from stepscope.report import build_report
    from stepscope.rules import WeightUpdateRatio, run_rules
    from stepscope.rules.profiler import StepOutlier

    server, driver, root = served
    rng = np.random.default_rng(4)
    durations = [float(d) for d in 70 + 5 * rng.random(300)]
    durations[0] = 900.0
    for step in (40, 80, 120, 160, 200, 240):
        durations[step] = 170.0
    durations[280] = 320.0
    jittery = write_profiler_job(root / "team-a" / "jittery", durations_ms=durations)
    job = root / "team-a" / "with-eval"
    _train_with_evaluation(str(job))
    driver.get(server.url + "/")
    if driver.current_url.endswith("/login"):
        _login(driver, server.url)
    driver.get_log("browser")  # what earlier tests logged (a refused login) is theirs

    driver.get(f"{server.url}/jobs/team-a/jittery#dashboard")
    shown = wait_for(lambda: driver.find_elements("css selector", "#dashboard .step-outliers, .step-outliers"), what="outlier line")[0]
    rule = StepOutlier(**StepOutlier.preset).run(create_trial(str(jittery)).profiler)
    group = rule.statistics["groups"]["algo-1/rank0/TRAIN"]
    assert shown.get_attribute("data-outliers") == ",".join(str(o["step"]) for o in rule.statistics["outliers"]) == "280"
    assert float(shown.get_attribute("data-limit-ms")) == group["limit_ms"]
    naive = np.array(durations[1:]).mean() + 3 * np.array(durations[1:]).std()
    assert sum(d > naive for d in durations[1:]) == 7  # what the dashboard used to mark
    screenshot(driver, "12-outliers-are-the-rules")

    trial = create_trial(str(job))
    modes = {s: trial.mode_of(s)[0].name for s in trial.steps()}
    assert list(modes.values()) == ["TRAIN"] * 6 + ["EVAL"] * 2 + ["TRAIN"] * 6
    driver.get(f"{server.url}/jobs/team-a/with-eval#health")
    ratios = _chart(driver, "update-ratios")
    assert ratios["x"] and all(modes[s] == "TRAIN" for s in ratios["x"])  # no EVAL-step weights: no dip to 0
    last = wait_for(lambda: driver.find_elements("css selector", "#update-ratio-last tbody tr"), what="last update ratios")
    cells = {row.find_elements("css selector", "td")[0].text: row.find_elements("css selector", "td") for row in last}
    weight = "0.weight"
    step = int(cells[weight][2].get_attribute("data-value"))
    train = [s for s in trial.tensor(weight).steps() if modes[s] == "TRAIN"]
    before = trial.tensor(weight).value(train[train.index(step) - 1]).astype(np.float64)
    after = trial.tensor(weight).value(step).astype(np.float64)
    expected = np.sqrt(((after - before) ** 2).sum()) / max(np.sqrt((before ** 2).sum()), 1e-3 * np.sqrt(before.size))
    in_dom = float(cells[weight][3].get_attribute("data-value"))
    assert step == train[-1] and in_dom == pytest.approx(expected, rel=1e-9)
    # the rule judges that number, the report shows it
    (report,) = run_rules([WeightUpdateRatio(trial, small_threshold=1e6, large_threshold=1e7)])
    assert [e.data["ratio"] for e in report.evidence if e.tensor == weight and e.step == step] == [pytest.approx(in_dom, rel=1e-12)]
    rows = {r[0]: r for r in build_report(str(job), rules="none").section("health").table("update-ratios").rows}
    assert rows[weight][3] == step and rows[weight][4] == pytest.approx(in_dom, rel=1e-12)
    # curves on global steps, one mode each; the ridge of one mode
    loss = trial.tensor_names(collection="losses")[0]
    assert _chart(driver, f"curve:{loss}:EVAL")["x"] == [s for s in modes if modes[s] == "EVAL"] == [6, 7]
    assert _chart(driver, f"curve:{loss}:TRAIN")["x"] == [s for s in modes if modes[s] == "TRAIN"]
    ridge = wait_for(lambda: driver.execute_script("const c = window.stepscope.charts['tensor-histogram']; return c && c.mode ? c : null"), what="ridge")
    assert ridge["mode"] == "TRAIN" and all(modes[s] == "TRAIN" for s in ridge["steps"])
    units = _chart(driver, "inactive-units")
    assert units["rows"] and all(r.endswith("TRAIN)") or r.endswith("EVAL)") for r in units["rows"])
    screenshot(driver, "13-health-global-steps")
    severe = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert not severe, severe
