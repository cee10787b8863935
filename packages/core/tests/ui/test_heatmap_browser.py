"""The gradient-norm heatmap of a deep network in a real headless Chromium: beyond 30 rows
the labels would overlap, so rows merge per module, each cell the largest norm of the
module's tensors, and the page says so. Screenshot in artifacts/ui/."""

from __future__ import annotations

import re

import numpy as np
import pytest

from stepscope.trial import create_trial

from .browser import app_in_browser, chromium_paths, screenshot, sign_in, wait_for
from .conftest import train_deep_mlp

pytestmark = pytest.mark.heavy

LAYERS = 20  # 40 gradient tensors (weight and bias of each Linear)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    chromium_paths()
    root = tmp_path_factory.mktemp("store")
    train_deep_mlp(str(root / "team-a" / "deep"), layers=LAYERS, width=6, activation="Tanh", steps=4, batch=8, collections=["gradients", "losses"])
    with app_in_browser(root, tmp_path_factory.mktemp("db"), {"alice": ["team-a"]}) as (server, driver):
        yield server, driver, root


def test_a_deep_networks_heatmap_merges_rows_by_module(served):
    server, driver, root = served
    sign_in(driver, server.url)
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
