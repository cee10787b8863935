"""The compare page in a real headless Chromium: tick two jobs on the jobs list, compare;
the figures in the DOM are stepscope.diff's for the same two jobs; a job of another team
cannot be compared (the API checks both grants). Screenshots land in artifacts/ui/."""

from __future__ import annotations

import pytest

from stepscope.diff import compare

from .browser import app_in_browser, chromium_paths, screenshot, sign_in, wait_for

pytestmark = pytest.mark.heavy


def _train(out_dir: str, lr: float, width: int) -> None:
    torch = pytest.importorskip("torch")
    from stepscope.config import SaveConfig
    from stepscope_torch import Hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(1)
    with Hook(out_dir, save_config=SaveConfig(save_interval=2), include_collections=["weights", "gradients", "losses"]) as hook:
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.register_optimizer(optimizer)
        for _ in range(16):
            x, y = torch.randn(32, 8, generator=generator), torch.randint(0, 3, (32,), generator=generator)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from stepscope.cli import main

    chromium_paths()  # skip before training when there is no browser
    root = tmp_path_factory.mktemp("store")
    _train(str(root / "team-a" / "lr0"), lr=0.0, width=16)
    _train(str(root / "team-a" / "lr01"), lr=0.1, width=16)
    _train(str(root / "team-b" / "theirs"), lr=0.1, width=16)
    for job in ("team-a/lr0", "team-a/lr01"):
        main(["check", str(root / job), "--rule", "WeightUpdateRatio", "--quiet"])
    with app_in_browser(root, tmp_path_factory.mktemp("db"), {"alice": ["team-a"]}) as (server, driver):
        yield server, driver, root


def _cell_number(text: str) -> float:
    return float(text.replace(",", ""))


def test_compare_two_jobs_in_the_browser(served):
    server, driver, root = served
    sign_in(driver, server.url)
    wait_for(lambda: len(driver.find_elements("css selector", "#jobs-table tbody tr")) == 2, what="alice's two jobs")
    button = driver.find_element("id", "jobs-compare")
    assert not button.is_enabled()
    for job in ("team-a/lr0", "team-a/lr01"):  # the list redraws itself: look each box up afresh
        wait_for(lambda job=job: driver.find_element("css selector", f'#jobs-table tr[data-job="{job}"] input.pick'), what=job).click()
    wait_for(lambda: driver.find_element("id", "jobs-compare").is_enabled(), what="compare enabled")
    screenshot(driver, "compare-01-jobs-picked")
    driver.find_element("id", "jobs-compare").click()
    wait_for(lambda: driver.find_elements("css selector", "#view[data-loaded]"), what="comparison", timeout=60)
    assert driver.find_element("id", "compare-a").text == "team-a/lr0"
    shown = driver.execute_script("return window.stepscope.charts.compare")
    expected = compare(str(root / "team-a" / "lr0"), str(root / "team-a" / "lr01"), rules="saved").to_json()
    # the tensors the two jobs saved: the lr-0 job's weights never move, lr 0.1's do
    tensors = {r["key"]: r for r in next(s for s in expected["sections"] if s["name"] == "tensors")["rows"]}
    assert any(r["status"] == "changed" for r in tensors.values())
    drawn = {r["key"]: r for r in next(s for s in shown["sections"] if s["name"] == "tensors")["rows"]}
    assert drawn.keys() == tensors.keys()
    for key, row in tensors.items():
        assert drawn[key]["a"] == pytest.approx(row["a"]) and drawn[key]["b"] == pytest.approx(row["b"])
        if row["status"] == "changed":  # and the DOM shows the same numbers
            tr = driver.find_element("css selector", f'#compare-tensors tr[data-key="{key}"]')
            cells = tr.find_elements("css selector", "td.num")
            assert _cell_number(cells[0].text) == pytest.approx(row["a"], rel=1e-3)
            assert _cell_number(cells[1].text) == pytest.approx(row["b"], rel=1e-3)
    rules = next(s for s in shown["sections"] if s["name"] == "rules")["rows"]
    assert {r["key"]: (r["a"], r["b"]) for r in rules}["WeightUpdateRatio"][0] == "fired"  # lr 0: nothing moves
    screenshot(driver, "compare-02-page")

    # another team's job: refused like any job alice may not see, and the page says so
    driver.get(server.url + "/compare?a=team-a/lr0&b=team-b/theirs")
    error = wait_for(lambda: driver.find_element("id", "compare-error"), what="refusal")
    assert "no such job" in error.text
    assert driver.execute_script("return window.stepscope.charts.compare || null") is None
