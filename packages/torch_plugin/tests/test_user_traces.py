"""A user's own torch.profiler traces open with every entry point: a folder written by
torch.profiler.tensorboard_trace_handler from two processes (CPU, several steps, written
here by real torch), one file of it, `stepscope profile`, `stepscope timeline`,
`create_trial(...).profiler.traces`, `stepscope.traces.open` and the web app's job store.
Expected values come from the JSON files themselves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytestmark = pytest.mark.heavy

import stepscope.traces  # noqa: E402
from stepscope import create_trial  # noqa: E402
from stepscope.cli import main as cli_main  # noqa: E402

STEPS = 3  # schedule(wait=1, warmup=1, active=3)
_WRITER = textwrap.dedent(
    """
    import sys, torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler
    torch.manual_seed(int(sys.argv[2]))
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=tensorboard_trace_handler(sys.argv[1])) as prof:
        for step in range(6):
            x = torch.randn(16, 32)
            with record_function("forward"):
                loss = model(x).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            prof.step()
    """
)


@pytest.fixture(scope="module")
def store_root(tmp_path_factory) -> Path:
    """A store holding one folder of traces written by two processes at once."""
    root = tmp_path_factory.mktemp("user-traces")
    run = root / "my-run"
    script = root / "writer.py"
    script.write_text(_WRITER)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    workers = [subprocess.Popen([sys.executable, str(script), str(run), str(seed)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for seed in (0, 1)]
    assert [w.wait(timeout=300) for w in workers] == [0, 0]
    assert len(list(run.glob("*.pt.trace.json"))) == 2
    return root


def _files(run: Path) -> list[Path]:
    return sorted(run.glob("*.pt.trace.json"))


def _counts(path: Path, name: str) -> int:
    events = json.loads(path.read_text())["traceEvents"]
    return sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e.get("name") == name)


def test_open_the_folder_one_rank_per_process(store_root: Path) -> None:
    run = store_root / "my-run"
    analysis = stepscope.traces.open(str(run))
    assert analysis.ranks == [0, 1]  # no distributedInfo, no rank in the names: one per worker
    traces = analysis.traces().set_index("key")
    files = _files(run)
    assert sorted(traces.index) == sorted(f.name for f in files)
    ops = analysis.cpu_ops(k=None)
    for path in files:
        expected = _counts(path, "aten::addmm")
        got = ops[(ops["rank"] == traces.loc[path.name, "rank"]) & (ops["name"] == "aten::addmm")]["count"].sum()
        assert got == expected > 0
    steps = analysis.step_breakdown()
    assert sorted(steps["step"].unique()) == [2, 3, 4] and len(steps) == 2 * STEPS
    assert (run / "stepscope-traces").is_dir()  # the tables beside the traces


def test_open_one_file(store_root: Path) -> None:
    path = _files(store_root / "my-run")[0]
    analysis = stepscope.traces.open(str(path))
    assert analysis.trace_keys() == [path.name]
    assert analysis.cpu_ops(k=None).set_index("name").loc["aten::addmm", "count"] == _counts(path, "aten::addmm")


def test_create_trial_on_the_folder(store_root: Path) -> None:
    traces = create_trial(str(store_root / "my-run")).profiler.traces
    assert traces.ranks == [0, 1]


def test_profile_and_timeline_commands(store_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = store_root / "my-run"
    assert cli_main(["profile", str(run), "--json"]) == 0
    tables = json.loads(capsys.readouterr().out)
    assert sorted(row["rank"] for row in tables["traces"]) == [0, 1]
    assert {row["name"] for row in tables["cpu_ops"]} >= {"aten::addmm"}
    # One file: the text shows the same tables as its --json, each CPU op of the top ones
    # among them. (Which ops are the top ones depends on the machine's load while the
    # traces were written: aten::addmm is not always among them.)
    assert cli_main(["profile", str(_files(run)[1]), "--json"]) == 0
    top = [row["name"] for row in json.loads(capsys.readouterr().out)["cpu_ops"]]
    assert top and _counts(_files(run)[1], "aten::addmm") > 0
    assert cli_main(["profile", str(_files(run)[1])]) == 0
    text = capsys.readouterr().out
    assert "== cpu ops" in text and all(name in text for name in top), text
    out = tmp_path / "timeline.json"
    assert cli_main(["timeline", str(run), "-o", str(out)]) == 0
    timeline = json.loads(out.read_text())
    slices = [e for e in timeline["traceEvents"] if e.get("ph") == "X"]
    assert {e["pid"] for e in slices if e["name"] == "aten::addmm"} == {0, 1}


def test_the_app_lists_and_opens_the_folder(store_root: Path, tmp_path: Path) -> None:
    pytest.importorskip("flask")
    from stepscope.ui.jobs import JobStore

    jobs = JobStore(str(store_root))
    assert "my-run" in jobs.job_ids()
    store = jobs.open("my-run")
    assert create_trial(store).profiler.traces.ranks == [0, 1]


def test_a_read_only_folder_keeps_its_tables_in_the_user_cache(store_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "copy"
    shutil.copytree(store_root / "my-run", run, ignore=shutil.ignore_patterns("stepscope-traces"))
    (run / "stepscope-traces").write_text("")  # the tables' folder cannot be made (root ignores chmod)
    monkeypatch.setenv("STEPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    analysis = stepscope.traces.open(str(run))
    assert analysis.ranks == [0, 1]
    analysis.wait_persisted()
    assert len(list((tmp_path / "cache").rglob("*.parquet"))) == 2
    again = stepscope.traces.open(str(run))
    assert again.cpu_ops(k=None).equals(analysis.cpu_ops(k=None))


def test_without_pyarrow_the_command_names_the_extra(store_root: Path) -> None:
    code = "import sys; sys.modules['pyarrow'] = None; from stepscope.cli import main; sys.exit(main(['profile', sys.argv[1]]))"
    result = subprocess.run([sys.executable, "-c", code, str(store_root / "my-run")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "pip install 'stepscope[traces]'" in result.stderr
    assert "ModuleNotFoundError" not in result.stderr


def test_a_job_without_detailed_traces_has_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A job's own JSON files (index, collections, step tables, status, system metrics, rule
    reports) are never taken for a user's traces: none is read as one and skipped."""
    import torch

    from stepscope.config import ProfilerConfig, SaveConfig
    from stepscope_torch import Hook

    job = tmp_path / "job"
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = Hook(str(job), save_config=SaveConfig(save_interval=1), include_collections=["weights", "losses"],
                profiler_config=ProfilerConfig(system_monitor=True, monitor_interval_ms=100, step_timeline=True))
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    try:
        for _ in range(3):
            optimizer.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            hook.save_loss(loss)
            loss.backward()
            optimizer.step()
    finally:
        hook.close()
    assert any(job.glob("index/*/*.json")) and any(job.glob("collections/*/*.json"))
    with caplog.at_level("WARNING"):
        traces = create_trial(str(job)).profiler.traces
        assert traces.trace_keys() == [] and traces.ranks == []
    assert "skipping trace" not in caplog.text
