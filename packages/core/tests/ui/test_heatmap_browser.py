"""The gradient-norm heatmap of a deep network in a real headless Chromium: beyond 30 rows
the labels would overlap, so rows merge per module, each cell the largest norm of the
module's tensors, and the page says so. Screenshot in artifacts/ui/."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from stepscope.trial import create_trial
from stepscope.ui import bundle
from stepscope.ui.app import create_app
from stepscope.ui.jobs import JobStore
from stepscope.ui.users import UserDB

from .browser import REPO, LiveServer, chromium_paths, quit_browser, screenshot, start_browser, wait_for
from .conftest import PASSWORD

pytestmark = pytest.mark.heavy

LAYERS = 20  # 40 gradient tensors (weight and bias of each Linear)


def _train(out_dir: str) -> None:
    torch = pytest.importorskip("torch")
    from stepscope.config import SaveConfig
    from stepscope_torch import Hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(LAYERS) for m in (torch.nn.Linear(6, 6), torch.nn.Tanh())])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with Hook(out_dir, save_config=SaveConfig(save_interval=1), include_collections=["gradients", "losses"]) as hook:
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        for _ in range(4):
            optimizer.zero_grad()
            loss = model(torch.randn(8, 6)).pow(2).mean()
            hook.save_loss(loss)
            loss.backward()
            optimizer.step()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    chromium_paths()
    root = tmp_path_factory.mktemp("store")
    _train(str(root / "team-a" / "deep"))
    if bundle.missing():
        subprocess.run([sys.executable, str(REPO / "scripts" / "build_ui.py")], check=True)
    db = UserDB(tmp_path_factory.mktemp("db") / "users.db", argon2_memory_kib=256, argon2_time_cost=1)
    db.add_user("alice", PASSWORD, prefixes=["team-a"])
    server = LiveServer(create_app(JobStore(str(root)), db))
    driver = start_browser()
    yield server, driver, root
    quit_browser(driver)
    server.stop()


def test_a_deep_networks_heatmap_merges_rows_by_module(served):
    server, driver, root = served
    driver.get(server.url + "/login")
    driver.find_element("id", "username").send_keys("alice")
    driver.find_element("id", "password").send_keys(PASSWORD)
    driver.find_element("id", "login").click()
    wait_for(lambda: driver.find_elements("css selector", "#jobs-table tbody tr"), what="jobs list")
    driver.get(server.url + "/jobs/team-a/deep#health")
    chart = wait_for(lambda: driver.execute_script("const c = window.stepscope.charts['gradient-norms']; return c && c.drawnRows ? c : null"),
                     what="gradient-norm heatmap")
    trial = create_trial(str(root / "team-a" / "deep"))
    names = sorted(trial.tensor_names(collection="gradients"))
    assert len(names) == 2 * LAYERS and sorted(chart["rows"]) == names  # every tensor sent
    drawn = chart["drawnRows"]
    assert len(drawn) <= 30 < len(names)
    # one row per Linear ("gradient/6.weight" and "gradient/6.bias" -> "gradient.6 (2)"),
    # each cell the largest of its two norms, computed here from the saved values
    assert sorted(drawn) == sorted(f"gradient.{2 * i} (2)" for i in range(LAYERS))
    steps = chart["columns"]
    merged = chart["drawnValues"]  # the cells drawn
    for label in drawn:
        module = re.match(r"gradient\.(\d+) ", label).group(1)
        expected = [max(float(np.linalg.norm(trial.tensor(f"gradient/{module}.{kind}").value(s).ravel())) for kind in ("weight", "bias")) for s in steps]
        np.testing.assert_allclose(merged[drawn.index(label)], expected, rtol=1e-5)
    page = driver.find_element("tag name", "body").text
    assert f"{2 * LAYERS} tensors merged into {LAYERS} rows by module" in page
    screenshot(driver, "heatmap-merged-by-module")
