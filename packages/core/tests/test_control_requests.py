"""On-demand requests through the job's control folder (capture/control.py, the stop
seam in capture/stop.py): a request left by an earlier run is passed over, a new one is
handed over once at the next TRAIN step end and answered per worker, a malformed one is
ignored; a hook whose plugin has no handler answers that it does not support it."""

from __future__ import annotations

import json
import time

import pytest

from stepscope.capture.control import BLACK_BOX, MEMORY_SNAPSHOT, StopPoller, read_responses, response_key, send_request
from stepscope.capture.hook import HookBase
from stepscope.config import ProfilerConfig
from stepscope.layout import REQUEST_KEY
from stepscope.store import open_store


def test_the_poller_passes_over_an_earlier_request_and_hands_a_new_one_over_once(tmp_path, monkeypatch):
    from stepscope.capture import control

    store = open_store(str(tmp_path))
    send_request(store, MEMORY_SNAPSHOT, "an earlier run's")
    started = time.time() + 1  # this process started after the earlier run wrote its request
    monkeypatch.setattr(control, "_process_start_time", lambda: started)
    seen = []
    poller = StopPoller(store, interval_s=3600, on_control=lambda: seen.append(1))  # (polled by hand below)
    try:
        assert not poller.check_control() and poller.take_control() is None and seen == []
        request_id = send_request(store, BLACK_BOX, "worker_1 saved NaN", worker="worker_1")
        assert poller.check_control() and seen == [1]
        request = poller.take_control()
        assert request["id"] == request_id and request["action"] == BLACK_BOX and request["worker"] == "worker_1"
        assert poller.take_control() is None and not poller.check_control()  # once
        store.write(REQUEST_KEY, b'{"action": "format_disk", "id": "x"}')
        assert not poller.check_control() and seen == [1]  # not an action hooks take
    finally:
        poller.close()
    with pytest.raises(ValueError, match="unknown request action"):
        send_request(store, "format_disk")


@pytest.mark.parametrize("started_before_request", [True, False])
def test_a_request_found_at_start_counts_only_when_written_after_this_process_started(tmp_path, monkeypatch, started_before_request):
    """A rank whose hook starts after a peer already failed (no rendezvous before training)
    still sees the peer's stop and black-box request; the first poller of a process that
    started after the requests were written (a new run in the same folder) passes them over."""
    from stepscope.capture import control

    store = open_store(str(tmp_path))
    control.request_stop(store, "BlackBox", "worker_1: OutOfMemoryError")
    request_id = send_request(store, BLACK_BOX, "worker_1 failed", worker="worker_1")
    written = time.time()
    monkeypatch.setattr(control, "_pollers_started", 0)  # this poller is the process's first
    monkeypatch.setattr(control, "_process_start_time", lambda: written - 5 if started_before_request else written + 5)
    poller = StopPoller(store, interval_s=3600)
    try:
        assert poller.check_now() is started_before_request
        assert poller.check_control() is started_before_request
        if started_before_request:
            assert poller.request["rule"] == "BlackBox" and poller.take_control()["id"] == request_id
    finally:
        poller.close()
    second = StopPoller(store, interval_s=3600)  # a second poller in one process: passes over what it finds
    try:
        assert not second.check_now() and not second.check_control()
    finally:
        second.close()


def test_a_hook_without_a_handler_answers_at_its_next_train_step_end(tmp_path):
    hook = HookBase(str(tmp_path), profiler_config=ProfilerConfig.disabled(), control_poll_s=0.05)
    try:
        request_id = send_request(hook.store, MEMORY_SNAPSHOT)
        deadline = time.monotonic() + 20
        while not read_responses(hook.store, request_id) and time.monotonic() < deadline:
            hook.begin_step("train")
            hook.end_step()
            time.sleep(0.02)
        (answer,) = read_responses(hook.store, request_id)
        assert answer["worker"] == "worker_0" and answer["written"] == [] and "does not support 'memory_snapshot'" in answer["error"]
        assert json.loads((tmp_path / response_key(request_id, "worker_0")).read_text())["step"] >= 1
    finally:
        hook.close()


def test_the_snapshot_command_says_when_no_worker_answers(tmp_path, capsys):
    from stepscope.cli import main
    from stepscope.cli_common import EXIT_ERROR, EXIT_OK

    (tmp_path / "job").mkdir()
    assert main(["memory", "snapshot", str(tmp_path / "job"), "--wait", "0.3"]) == EXIT_ERROR
    captured = capsys.readouterr()
    assert "no worker answered within 0.3 s" in captured.err and "request " in captured.out
    assert json.loads((tmp_path / "job" / REQUEST_KEY).read_text())["action"] == MEMORY_SNAPSHOT
    assert main(["memory", "snapshot", str(tmp_path / "job"), "--wait", "0"]) == EXIT_OK  # leave it, do not wait
    assert main(["memory", "snapshot", str(tmp_path / "nowhere")]) == EXIT_ERROR
    assert "no such job" in capsys.readouterr().err
