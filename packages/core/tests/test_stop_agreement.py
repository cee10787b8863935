"""The ranks' stop agreement seam of HookBase: when a plugin says its ranks can agree, the
collective runs only at every STEPSCOPE_STOP_AGREE_STEPS-th TRAIN step end, and a rank stops
at the agreed step even when its own poller never saw the request."""

from __future__ import annotations

import pytest

from stepscope import ModeKeys
from stepscope.capture.control import request_stop
from stepscope.capture.hook import HookBase, StopTrainingRequested
from stepscope.config import ProfilerConfig
from stepscope.exceptions import ConfigError


class AgreeingHook(HookBase):
    """A rank whose peers are simulated: `peer_saw` is what the other ranks contribute."""

    def __init__(self, *args, **kwargs):
        self.calls: list[tuple[int, bool]] = []
        self.peer_saw = False
        super().__init__(*args, **kwargs)

    def _can_agree_on_stop(self) -> bool:
        return True

    def _agree_on_stop(self, local: bool) -> bool:
        self.calls.append((self._counters.train_ends, local))
        return local or self.peer_saw


def _hook(tmp_path, cls=AgreeingHook):
    # A poll interval far beyond the test: this rank's poller never looks by itself.
    return cls(str(tmp_path / "job"), rank=1, world_size=2, control_poll_s=1000, profiler_config=ProfilerConfig.disabled())


def _train_step(hook) -> None:
    hook.begin_step(ModeKeys.TRAIN)
    hook.end_step()


def test_the_collective_runs_only_at_agreement_steps(tmp_path, monkeypatch):
    monkeypatch.delenv("STEPSCOPE_STOP_AGREE_STEPS", raising=False)
    hook = _hook(tmp_path)
    for step in range(20):
        _train_step(hook)
        hook.begin_step(ModeKeys.EVAL)  # evaluation steps are not counted
        hook.end_step()
        assert hook._counters.train_ends == step + 1
    assert hook.calls == [(1, False), (8, False), (16, False)]
    assert not hook.stop_requested
    hook.close()


def test_a_rank_stops_at_the_agreed_step_though_it_never_saw_the_request(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_STOP_AGREE_STEPS", "4")
    hook = _hook(tmp_path)
    for _ in range(5):
        _train_step(hook)
    hook.peer_saw = True  # another rank's poller saw the request during step 6
    _train_step(hook)
    _train_step(hook)
    assert not hook.stop_requested
    with pytest.raises(StopTrainingRequested):
        _train_step(hook)  # the 8th TRAIN step: the agreement step
    assert hook._counters.train_ends == 8 and hook.stop_requested and hook.stop_poller.request is None
    assert hook.calls == [(1, False), (4, False), (8, False)]
    _train_step(hook)  # raised once; no collective once all ranks agreed
    assert hook.calls[-1] == (8, False) and hook.train_step_ended()
    hook.close()


def test_this_ranks_own_request_goes_into_the_collective(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_STOP_AGREE_STEPS", "3")
    hook = _hook(tmp_path)
    _train_step(hook)
    request_stop(hook.store, "ExplodingTensor", "NaN")
    hook.stop_poller.check_now()
    _train_step(hook)  # seen, but not an agreement step: no stop yet
    with pytest.raises(StopTrainingRequested):
        _train_step(hook)
    assert hook.calls == [(1, False), (3, True)]
    hook.close()


def test_a_rank_deciding_alone_stops_at_the_next_train_step_end(tmp_path):
    hook = _hook(tmp_path, HookBase)  # the default seam: no collective
    for _ in range(3):
        _train_step(hook)
    assert hook._counters.stop_check_at > 10**9  # parked: the steps cost one comparison
    request_stop(hook.store, "ExplodingTensor", "NaN")
    hook.stop_poller.check_now()
    assert hook.stop_requested
    with pytest.raises(StopTrainingRequested):
        _train_step(hook)
    hook.close()


@pytest.mark.parametrize("raw", ["0", "-2", "every", "1.5"])
def test_a_bad_agreement_interval_is_a_clear_error(tmp_path, monkeypatch, raw):
    monkeypatch.setenv("STEPSCOPE_STOP_AGREE_STEPS", raw)
    with pytest.raises(ConfigError, match="STEPSCOPE_STOP_AGREE_STEPS"):
        _hook(tmp_path)


def test_a_rank_whose_hook_turned_off_still_takes_part(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_STOP_AGREE_STEPS", "4")
    hook = _hook(tmp_path)
    for _ in range(2):
        _train_step(hook)
    hook.failsafe.fail(RuntimeError("planted failure inside the hook"))  # as an internal error would
    assert not hook.enabled
    for _ in range(3):
        hook.begin_step(ModeKeys.EVAL)  # not counted, also while off
        hook.end_step()
        _train_step(hook)
    assert hook._counters.train_ends == 5 and hook.calls == [(1, False), (4, False)]
    hook.peer_saw = True
    _train_step(hook)
    _train_step(hook)
    with pytest.raises(StopTrainingRequested, match="another rank"):
        _train_step(hook)  # stops with its peers at the agreed step, though off
    assert hook._counters.train_ends == 8
    hook.close()


def test_an_early_wake_up_by_the_poller_does_not_add_a_collective(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_STOP_AGREE_STEPS", "4")
    hook = _hook(tmp_path)
    _train_step(hook)
    hook._counters.stop_check_at = 0  # the poller's wake-up, racing the first decision
    _train_step(hook)
    _train_step(hook)
    _train_step(hook)
    assert hook.calls == [(1, False), (4, False)]
    hook.close()
