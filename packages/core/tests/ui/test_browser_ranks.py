"""The Ranks page in a real headless Chromium, on a generated 4-rank job (stepscope.traces.
synth) whose rank 2 runs its kernels twice as long: the per-rank table and the stragglers in
the DOM equal JobQuery's numbers, under the same per-user access checks as the other views."""

from __future__ import annotations

import pytest

from stepscope.traces.cluster import JobQuery
from stepscope.traces.synth import SynthSpec, trace_bytes
from stepscope.ui import bundle
from stepscope.ui.app import create_app
from stepscope.ui.jobs import JobStore
from stepscope.ui.users import UserDB

from .browser import REPO, LiveServer, quit_browser, screenshot, start_browser, wait_for
from .conftest import PASSWORD

pytestmark = pytest.mark.heavy
pytest.importorskip("duckdb")

DETAILED = "profiler-output/framework/pytorch/detailed"
RANKS, STRAGGLER = 4, 2


def _write_job(job, ranks: int, straggler: int | None) -> dict:
    truths = {}
    for rank in range(ranks):
        spec = SynthSpec(steps=3, ops_per_step=24, seed=3, slow_factor=2.0 if rank == straggler else 1.0)
        data, truths[rank] = trace_bytes(spec)
        data = data.replace(b'"rank": 0, "world_size": 1', f'"rank": {rank}, "world_size": {ranks}'.encode(), 1)
        path = job / DETAILED / f"rank{rank}" / "window_000000.pt.trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (job / "training_job_end.ts").write_text("")
    return truths


def _dom_table(driver, table_id: str) -> list[list[str]]:
    return wait_for(lambda: driver.execute_script(
        "const t = document.getElementById(arguments[0]); if (!t) return null;"
        "return [...t.querySelectorAll('tbody tr')].map(r => [...r.children].map(td => td.dataset.value));", table_id), what=table_id)


def test_ranks_page_equals_jobquery(tmp_path):
    import subprocess
    import sys

    if bundle.missing():
        subprocess.run([sys.executable, str(REPO / "scripts" / "build_ui.py")], check=True)
    truths = _write_job(tmp_path / "team-a" / "dist", RANKS, STRAGGLER)
    _write_job(tmp_path / "team-b" / "other", RANKS, None)
    db = UserDB(tmp_path / "users.db", argon2_memory_kib=256, argon2_time_cost=1)
    db.add_user("alice", PASSWORD, prefixes=["team-a"])
    server = LiveServer(create_app(JobStore(str(tmp_path)), db))
    driver = start_browser()
    try:
        driver.get(server.url + "/login")
        driver.find_element("id", "username").send_keys("alice")
        driver.find_element("id", "password").send_keys(PASSWORD)
        driver.find_element("id", "login").click()
        wait_for(lambda: driver.find_elements("css selector", "#jobs-table tbody tr"), what="jobs list")
        driver.get(f"{server.url}/jobs/team-a/dist#ranks")
        rows = _dom_table(driver, "ranks-table-compare")
        slow = _dom_table(driver, "ranks-table-stragglers")
        header = driver.execute_script("return [...document.querySelectorAll('#ranks-table-stragglers thead th')].map(th => th.textContent)")
        with JobQuery(str(tmp_path / "team-a" / "dist")) as query:
            expected = query.rank_comparison()
            stragglers = query.straggler_ranks()
        assert [int(r[0]) for r in rows] == expected["rank"].tolist() == list(range(RANKS))
        for i, column in enumerate(expected.columns):
            assert [float(r[i]) for r in rows] == pytest.approx(expected[column].astype(float).tolist()), column
        # and the generator's own truth: mean step time per rank
        assert [float(r[2]) for r in rows] == pytest.approx([sum(t.step_ns.values()) / len(t.step_ns) / 1e3 for t in truths.values()])
        assert [int(r[0]) for r in slow] == stragglers["rank"].tolist() == [STRAGGLER]
        column = header.index("median_excess_us")
        assert float(slow[0][column]) == pytest.approx(float(stragglers["median_excess_us"].iloc[0]))
        assert slow[0][header.index("slowest_part")] == "compute kernels"
        screenshot(driver, "ranks-page")
        # another team's job: refused by the API like every other view
        status = driver.execute_script("return fetch('/api/jobs/team-b/other/ranks').then(r => r.status)")
        assert status in (403, 404)
    finally:
        quit_browser(driver)
        server.stop()
