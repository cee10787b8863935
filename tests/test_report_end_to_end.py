"""The report of a real small PyTorch job with a planted problem (a NaN in the inputs at
step 12, so ExplodingTensor fires there), checked against what the trial and the rules
return, opened in headless Chromium (selenium + chromedriver) and printed to PDF."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from html import escape

import numpy as np
import pytest
import torch
from torch import nn

import stepscope
import stepscope.export
from stepscope.cli import main as stepscope_cli
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.report import build_report, render_html, write_report
from stepscope.report.html import format_value
from stepscope.rules import default_rules, run_rules
from stepscope_torch import Hook

pytestmark = pytest.mark.heavy

NAN_STEP = 12
SECTIONS = ["summary", "rules", "health", "system", "steps", "gpu", "distributed", "memory", "cost"]
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HAVE_CHROMIUM = bool(shutil.which("chromium") or os.path.exists("/usr/bin/chromium"))
needs_chromium = pytest.mark.skipif(not (HAVE_CHROMIUM and os.path.exists(CHROMEDRIVER)), reason="needs Debian's chromium and chromedriver (nox -s tests installs them)")


def train(out_dir: str, steps: int = 24, eval_steps: int = 4, **hook_options) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(1)
    with Hook(out_dir, save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients", "losses"],
              profiler_config=ProfilerConfig(monitor_interval_ms=100), **hook_options) as hook:
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.register_optimizer(optimizer)
        for step in range(steps):
            x, y = torch.randn(16, 6, generator=generator), torch.randint(0, 3, (16,), generator=generator)
            if step == NAN_STEP:
                x[0, 0] = float("nan")  # the planted problem
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        hook.set_mode("eval")
        with torch.no_grad():
            for _ in range(eval_steps):
                loss_fn(model(torch.randn(16, 6, generator=generator)), torch.randint(0, 3, (16,), generator=generator))


@pytest.fixture(scope="module")
def live_tensorboard(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tb"))


@pytest.fixture(scope="module")
def job(tmp_path_factory, live_tensorboard):
    """The job, written by a hook that also writes TensorBoard live and its report at close."""
    path = str(tmp_path_factory.mktemp("report") / "job")
    train(path, tensorboard_dir=live_tensorboard, report=True)
    return path


@pytest.fixture(scope="module")
def written(job, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "report.html"
    return write_report(job, str(out), pdf=HAVE_CHROMIUM, rules="run")


def _table(html: str, key: str) -> list[list[str]]:
    found = re.search(rf'<table data-table="{re.escape(key)}">.*?<tbody>(.*?)</tbody>', html, re.S)
    if found is None:
        return []
    body = found.group(1)
    return [[re.sub(r"<[^>]+>", "", c).replace("&#x27;", "'").replace("&quot;", '"').replace("&amp;", "&") for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def test_sections_numbers_and_the_fired_rule(job, written):
    html = open(written.html, encoding="utf-8").read()
    assert re.findall(r'data-section="([^"]+)"', html) == SECTIONS
    trial = stepscope.create_trial(job)

    # Rules: the same statuses and violation counts as running the default rules directly.
    direct = {r.rule: r for r in run_rules(default_rules(stepscope.create_trial(job)))}
    # the rules that could judge in one table, the ones that could not folded in a second
    rows = {row[0]: row for key in ("rules", "rules-not-judged") for row in _table(html, key)}
    assert {row[0] for row in _table(html, "rules")} == {n for n, r in direct.items() if r.status in ("fired", "ok", "error")}
    assert set(rows) == set(direct)
    if _table(html, "rules-not-judged"):  # folded under its caption, which says how many and why
        assert re.search(r'<details><summary>The \d+ rule\(s\) that could not judge[^<]*</summary>(<div class="wide">)?<table data-table="rules-not-judged">', html)
    for name, report in direct.items():
        assert rows[name][2] == report.status and rows[name][3] == str(report.violations)
    assert direct["ExplodingTensor"].fired and direct["ExplodingTensor"].fired_steps[0] == NAN_STEP
    # The verdict comes first and names the fired rule and its first step.
    summary = html[html.index('data-section="summary"') : html.index('data-section="rules"')]
    assert "ExplodingTensor" in summary and re.search(rf"[Ff]irst at [^<]*step {NAN_STEP}\b", summary) and 'class="callout bad"' in summary
    callout = next(b for b in written.report.section("summary").blocks if getattr(b, "title", "").endswith("ExplodingTensor"))
    advice = direct["ExplodingTensor"].explanation.advice
    assert callout.level == "bad" and advice and list(callout.items) == list(advice)
    assert all(escape(a) in summary for a in advice)

    # Training health: first and last loss per mode equal the trial's values.
    loss_name = trial.tensor_names(collection="losses")[0]
    for row in _table(html, "curves"):
        name, mode, points, first_step, first_value, last_step, last_value = row
        values = trial.tensor(name).values(mode=mode)
        steps = sorted(values)
        assert name == loss_name and int(points) == len(steps)
        assert first_value == format_value(float(values[steps[0]])) and last_value == format_value(float(values[steps[-1]]))
        assert int(first_step) == trial.global_step(mode, steps[0])
    # Gradient norms: the last l2 equals the trial's reduction.
    for name, mode, _count, last_step, last_l2 in _table(html, "gradient-norms"):
        assert mode == "TRAIN" and trial.mode_of(int(last_step))[0].name == "TRAIN"  # a gradient at an EVAL step is stale
        assert last_l2 == format_value(trial.tensor(name).reduction_value(int(last_step), "l2"))
    # Steps: the count per mode equals the step timeline's.
    timeline = trial.profiler.step_timeline()
    for mode, _rank, count, *_ in _table(html, "step-durations"):
        assert int(count) == int(((timeline["mode"] == mode) & timeline["phase"].isin(["step", "eval_step"])).sum())
    # What was saved, and how often (the hook saved every step).
    assert {row[0]: row[2] for row in _table(html, "saved")}["gradients"] == "every 1 step"
    # Missing data says what to save.
    assert re.search(r'data-missing="gpu">[^<]*traces', html)


@needs_chromium
def test_opens_in_headless_chromium_without_errors_or_network(written, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1600"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get("file://" + os.path.abspath(written.html))
        assert driver.title.startswith("stepscope report")
        sections = driver.find_elements("css selector", "section[data-section]")
        assert [s.get_attribute("data-section") for s in sections] == SECTIONS
        assert len(driver.find_elements("css selector", "figure svg")) >= 4
        png = driver.get_screenshot_as_png()
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        requests = []
        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                # Only what our page asked for (the browser's new-tab page logs its own).
                if message["params"].get("documentURL", "").startswith("file:"):
                    requests.append(message["params"]["request"]["url"])
    finally:
        driver.quit()
    assert errors == []
    assert requests[0].endswith(os.path.basename(written.html))  # the page's own load is seen
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    (tmp_path / "screenshot.png").write_bytes(png)
    if os.environ.get("STEPSCOPE_KEEP_SCREENSHOT"):
        shutil.copy(tmp_path / "screenshot.png", os.environ["STEPSCOPE_KEEP_SCREENSHOT"])
    import matplotlib.image

    pixels = matplotlib.image.imread(io.BytesIO(png))[..., :3]
    assert pixels.shape[0] >= 1000 and pixels.shape[1] >= 1000
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    background = np.all(np.abs(pixels - pixels[-1, -1]) < 0.02, axis=-1).mean()
    assert len(colours) > 50 and background < 0.9  # text, tables and a header, not one colour


def _pdf_pages(data: bytes) -> int:
    pages = len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", data))
    counts = [int(c) for c in re.findall(rb"/Type\s*/Pages\b[^>]*?/Count\s+(\d+)", data) + re.findall(rb"/Count\s+(\d+)[^>]*?/Type\s*/Pages\b", data)]
    assert counts and max(counts) == pages, (counts, pages)
    return pages


@needs_chromium
def test_pdf_has_a_page_per_section_at_least(written):
    assert written.pdf and written.pdf.endswith(".pdf")
    data = open(written.pdf, "rb").read()
    assert data.startswith(b"%PDF-")
    pages = _pdf_pages(data)
    # Each section starts a page (print stylesheet); this small job fits each in one or two.
    assert len(SECTIONS) <= pages <= 2 * len(SECTIONS)


def test_cli_report_next_to_the_job_uses_saved_rule_output(job, capsys):
    assert stepscope_cli(["check", job, "--quiet"]) == 1  # writes rule-output/
    assert stepscope_cli(["report", job, "--no-progress"]) == 0
    out = capsys.readouterr().out
    path = os.path.join(job, "stepscope-report.html")
    assert f"report: {path}" in out
    html = open(path, encoding="utf-8").read()
    saved = json.load(open(os.path.join(job, "rule-output", "ExplodingTensor.json")))
    row = next(r for r in _table(html, "rules") if r[0] == "ExplodingTensor")
    assert row[2] == "fired" and row[3] == str(saved["violations"])


def test_report_of_a_job_on_s3(s3_url):
    train(s3_url, steps=6, eval_steps=0)
    result = write_report(s3_url)
    assert result.html == f"{s3_url}/stepscope-report.html"
    from stepscope.store import open_store

    html = open_store(s3_url).read("stepscope-report.html").decode()
    assert "<svg" in html and 'data-section="cost"' in html
    assert build_report(s3_url, rules="none").section("rules").missing
    assert render_html(build_report(s3_url, rules="none")).count("<section") == len(SECTIONS)


def test_exports_of_a_job_on_s3(s3_url, tmp_path):
    import h5py

    from stepscope.export import export_hdf5, export_tensorboard, hdf5_key

    train(s3_url, steps=5, eval_steps=1)
    trial = stepscope.create_trial(s3_url)
    tb = export_tensorboard(s3_url, tmp_path / "tb")
    assert tb.runs == ["eval", "train"] and tb.steps == 6
    export_hdf5(s3_url, tmp_path / "job.h5", stepscope.export.Selection.from_args(regex=["weight"]))
    with h5py.File(tmp_path / "job.h5") as h5:
        group = h5["tensors"][hdf5_key("gradient/0.weight")]
        for row, step in enumerate(group["step"][:]):
            np.testing.assert_array_equal(group["values"][row], trial.tensor("gradient/0.weight").value(int(step)))


def test_the_hook_wrote_its_report_its_cost_and_live_tensorboard(job, live_tensorboard):
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    from stepscope.job_files import read_costs
    from stepscope.store import open_store

    # report=True: written at close, next to the job, with the rules run then.
    html = open(os.path.join(job, "stepscope-report.html"), encoding="utf-8").read()
    assert "ExplodingTensor" in html and 'data-table="cost"' in html
    # The cost the hook measured: every step, time inside the hooks, the writer's bytes.
    cost = read_costs(open_store(job))["worker_0"]
    assert cost.steps == 28 and 0 < cost.hook_s < cost.step_s and cost.writer_s > 0
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(job) for f in files if f.endswith(".tfevents"))
    assert cost.bytes_written > on_disk > 0
    assert cost.versions["torch"] == torch.__version__
    (row,) = _table(html, "cost")
    assert row[0] == "worker_0" and row[1] == "28" and row[7] == str(cost.bytes_written)
    # tensorboard_dir=: the loss of every step, as TensorBoard's loader reads it.
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(live_tensorboard)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, live_tensorboard)
    scalars = provider.read_scalars(context.RequestContext(), experiment_id="", plugin_name="scalars", downsample=1000)
    trial = stepscope.create_trial(job)
    loss = trial.tensor_names(collection="losses")[0]
    points = scalars["train"][loss]
    values = trial.tensor(loss).values(mode="train")
    assert [p.step for p in points] == [trial.global_step("train", s) for s in sorted(values)]
    np.testing.assert_allclose([p.value for p in points], [float(values[s]) for s in sorted(values)], rtol=1e-6, equal_nan=True)
    histograms = provider.read_tensors(context.RequestContext(), experiment_id="", plugin_name="histograms", downsample=1000)
    assert "0.weight" in histograms["train"] and "eval" in scalars
