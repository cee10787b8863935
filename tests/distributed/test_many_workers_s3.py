"""64 workers on the S3 test server: a 64-worker x 1,000-step job opens with a few reads per
worker (counted at a proxy in front of the server), a refresh costs requests in proportion
to what is new, and 64 writer threads publishing at once leave every step complete and
exact. (Its opening time is measured by bench/bench_open_many_workers.py: goal < 2 s.)"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from stepscope import create_trial
from stepscope.store.s3 import S3Store
from stepscope.testing.large_jobs import load_into_moto, many_worker_job, step_value, write_worker

pytestmark = pytest.mark.heavy

WORKERS = 64
STEPS = 1000


def _gets(requests) -> int:
    return sum(1 for method, path in requests if method == "GET" and "list-type=" not in path)


@pytest.mark.timeout(600)
def test_a_64_worker_job_opens_with_reads_per_worker_and_refresh_costs_what_is_new(s3_url, via_proxy):
    sampled = (0, 17, 63)
    # Event files are read only for the sampled workers (the listing never looks at them).
    load_into_moto(many_worker_job(WORKERS, STEPS), s3_url, skip=lambda key: key.startswith("events/") and not key.endswith(tuple(f"_worker_{w}.tfevents" for w in sampled)))

    before = len(via_proxy.requests)
    started = time.monotonic()
    trial = create_trial(S3Store(s3_url))
    assert time.monotonic() - started < 30  # a hang bound; the time goal is the benchmark's
    opening = via_proxy.requests[before:]
    assert trial.num_workers == WORKERS and len(trial.workers()) == WORKERS
    assert trial.steps() == list(range(STEPS))
    assert _gets(opening) <= 2 * WORKERS + 4, _gets(opening)  # a collections file and a step table per worker
    assert len(opening) - _gets(opening) <= 10, opening  # listings and the end-marker check
    for worker, step in [(0, 0), (17, 555), (63, 999)]:
        np.testing.assert_array_equal(trial.tensor("ids").value(step, worker=f"worker_{worker}"), step_value(0, step))

    # Nothing new: a refresh is a handful of requests, whatever the job's size.
    before = len(via_proxy.requests)
    assert trial.refresh() == []
    assert len(via_proxy.requests) - before <= 6, via_proxy.requests[before:]

    # 64 writer threads publish 3 more steps each, through the S3 protocol, all at once.
    new = range(STEPS, STEPS + 3)
    threads = [threading.Thread(target=write_worker, args=(S3Store(s3_url), worker, new, WORKERS)) for worker in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    before = len(via_proxy.requests)
    assert trial.refresh() == list(new)
    refreshing = via_proxy.requests[before:]
    assert trial.steps() == list(range(STEPS + 3)) and not trial.problems
    assert _gets(refreshing) <= WORKERS * (len(new) + 2) + 4, _gets(refreshing)  # what is new, not the job
    for worker in sampled:
        for step in new:
            np.testing.assert_array_equal(trial.tensor("ids").value(step, worker=f"worker_{worker}"), step_value(worker, step))
