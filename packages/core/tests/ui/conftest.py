"""Fixtures of the app's tests: stores of small jobs written by the real writers, a user
database with cheap argon2 settings, and a logged-in Flask test client."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flask", reason="the app needs the `ui` extra (flask, argon2-cffi)")

from stepscope.modes import ModeKeys  # noqa: E402
from stepscope.profiler import TimelineWriter  # noqa: E402
from stepscope.ui.app import create_app  # noqa: E402
from stepscope.ui.jobs import JobStore  # noqa: E402
from stepscope.ui.users import UserDB  # noqa: E402

T0_NS = 1_700_000_000 * 10**9
PASSWORD = "correct horse battery"


def train_deep_mlp(out_dir: str, *, layers: int, width: int, activation: str, steps: int, batch: int, collections: list[str]) -> None:
    """A deep MLP (`layers` times Linear(width, width) + `activation`, e.g. "ReLU") trained
    on random inputs with the torch hook, `collections` saved every step."""
    torch = pytest.importorskip("torch")
    from stepscope.config import SaveConfig
    from stepscope_torch import Hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), getattr(torch.nn, activation)())])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with Hook(out_dir, save_config=SaveConfig(save_interval=1), include_collections=collections) as hook:
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        for _ in range(steps):
            optimizer.zero_grad()
            loss = model(torch.randn(batch, width)).pow(2).mean()
            hook.save_loss(loss)
            loss.backward()
            optimizer.step()


def write_profiler_job(root: Path, *, steps: int = 40, step_ms: float = 100.0, outliers: tuple[int, ...] = (), seed: int = 0,
                       start_ns: int = T0_NS, samples: int = 20, node: str = "algo-1", close: bool = True, durations_ms: list[float] | None = None) -> Path:
    """A job with a step timeline (steps with data/forward/backward/optimizer phases, written by
    the real TimelineWriter) and system metrics (SageMaker JSON lines), `outliers` steps 5x
    slower; `durations_ms`, when given, are the steps' durations."""
    rng = np.random.default_rng(seed)
    steps = len(durations_ms) if durations_ms is not None else steps
    root.mkdir(parents=True, exist_ok=True)
    writer = TimelineWriter(root, node_id=node, rank=0, framework="pytorch", flush_interval_s=3600)
    t = start_ns
    for step in range(steps):
        duration = step_ms * (5 if step in outliers else 1) * (1 + 0.05 * rng.random()) if durations_ms is None else durations_ms[step]
        end = t + int(duration * 1e6)
        writer.add(f"Step {step}", t, end, step=step, mode=ModeKeys.TRAIN, phase="step")
        cursor = t
        for phase, share in (("data", 0.1), ("forward", 0.3), ("backward", 0.4), ("optimizer", 0.1)):
            span = int(duration * 1e6 * share)
            writer.add(phase, cursor, cursor + span, step=step, mode=ModeKeys.TRAIN, phase=phase)
            cursor += span
        t = end + 1_000_000
    writer.close()
    lines = []
    for i in range(samples):
        ts = start_ns / 1e9 + i * 0.5
        for name, dim, value in (("total", "CPUUtilization", 40 + 10 * np.sin(i)), ("cpu0", "CPUUtilization", 35.0),
                                 ("gpu0", "GPUUtilization", 60 + i), ("gpu0", "GPUMemoryUtilization", 30.0)):
            kind = "gpu" if name.startswith("gpu") else "cpu"
            lines.append(json.dumps({"Type": kind, "Name": name, "Dimension": dim, "Value": round(float(value), 3), "NodeId": node, "Timestamp": ts}))
    minute = int(start_ns / 1e9 // 60 * 60)
    folder = root / "profiler-output/system/incremental" / time.strftime("%Y%m%d%H", time.gmtime(minute))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{minute}.{node}.json").write_text("\n".join(lines) + "\n")
    if close:
        (root / "training_job_end.ts").write_text("")
    return root


@pytest.fixture
def store_root(tmp_path):
    root = tmp_path / "store"
    write_profiler_job(root / "team-a" / "run-1", outliers=(10, 20))
    write_profiler_job(root / "team-a" / "run-2", steps=10, seed=1)
    write_profiler_job(root / "team-b" / "secret-run", steps=12, seed=2)
    (tmp_path / "outside.txt").write_text("not for you")
    return root


@pytest.fixture
def user_db(tmp_path):
    db = UserDB(tmp_path / "users.sqlite3", argon2_memory_kib=256, argon2_time_cost=1)
    db.add_user("root", PASSWORD, admin=True)
    db.add_user("alice", PASSWORD, prefixes=["team-a"])
    db.add_user("bob", PASSWORD, prefixes=["team-b"])
    yield db
    db.close()


@pytest.fixture
def app(store_root, user_db):
    app = create_app(JobStore(str(store_root)), user_db)
    app.testing = True
    return app


def login(client, name: str, password: str = PASSWORD):
    """Log in through the form as a browser would; returns the CSRF token of the session."""
    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    resp = client.post("/login", data={"username": name, "password": password, "csrf_token": token})
    assert resp.status_code == 302, resp.get_data(as_text=True)
    return client.get("/api/me").get_json()["csrf"]
