"""The phase tracker's table and the step timer, without any framework."""

from __future__ import annotations

import threading

import pytest

from stepscope.capture.phases import (
    EVENT_CODES,
    EVENTS,
    PHASES,
    STEP_BEGIN_EVENT_RECORD,
    TRANSITIONS,
    CpuClock,
    PhaseLog,
    PhaseTracker,
    StepTimer,
)
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys


def test_the_table_covers_every_event_in_both_kinds_of_step():
    assert {(training, event) for training in (True, False) for event in EVENTS} == set(TRANSITIONS)
    assert set(TRANSITIONS.values()) <= set(PHASES)


@pytest.mark.parametrize(
    "mode, events, expected",
    [
        (ModeKeys.TRAIN, ["forward_begin", "forward_end", "optimizer_begin", "optimizer_end"], ["data", "forward", "backward", "optimizer", "other"]),
        # Gradient accumulation: a second forward after the first backward.
        (ModeKeys.TRAIN, ["forward_begin", "forward_end", "forward_begin", "forward_end", "optimizer_begin"], ["data", "forward", "backward", "forward", "backward", "optimizer"]),
        # Lightning: backward reported explicitly.
        (ModeKeys.TRAIN, ["forward_begin", "backward_begin", "backward_end", "optimizer_begin"], ["data", "forward", "backward", "other", "optimizer"]),
        (ModeKeys.EVAL, ["forward_begin", "forward_end"], ["data", "forward", "other"]),
        (ModeKeys.PREDICT, [], ["data"]),
    ],
)
def test_transitions_tile_the_step(mode, events, expected):
    tracker = PhaseTracker()
    tracker.begin(mode, 100)
    for i, event in enumerate(events):
        tracker.event(event, 110 + 10 * i)
    begin, spans = tracker.end(1000)
    assert begin == 100 and [phase for phase, _, _ in spans] == expected
    # Consecutive, no gap, no overlap: the phases account for all of the step.
    assert spans[0][1] == 100 and spans[-1][2] == 1000
    assert all(a[2] == b[1] for a, b in zip(spans, spans[1:]))
    assert not tracker.open


def test_explicit_phases_and_repeats():
    tracker = PhaseTracker()
    tracker.event("forward_begin", 5)  # no step open: ignored
    tracker.begin(ModeKeys.TRAIN, 0)
    tracker.enter("forward", 3)
    tracker.enter("forward", 4)  # already there: the phase goes on
    tracker.enter("compute", 7)
    assert tracker.end(9) == (0, [("data", 0, 3), ("forward", 3, 7), ("compute", 7, 9)])
    assert tracker.end(10) == (None, [])
    with pytest.raises(ConfigError, match="unknown phase event 'fwd'"):
        tracker.begin(ModeKeys.TRAIN, 0)
        tracker.event("fwd", 1)


class LateClock(CpuClock):
    """Tokens known only once released, like GPU events."""

    def __init__(self):
        super().__init__()
        self.known = set()

    def ready(self, token):
        return token in self.known

    def wait(self, token):
        self.known.add(token)


def test_step_timer_hands_back_steps_in_order_once_known():
    clock = LateClock()
    timer = StepTimer(clock)
    timer.add_step(0, ModeKeys.TRAIN, [("data", 1, 2), ("step", 1, 3)])
    timer.add_step(1, ModeKeys.TRAIN, [("step", 3, 4)])
    timer.add_step(2, ModeKeys.TRAIN, [])  # nothing recorded: nothing to hand back
    assert list(timer.ready_steps()) == []
    clock.known.add(4)  # a later step known first: still in order
    assert list(timer.ready_steps()) == []
    clock.known.add(3)
    got = list(timer.ready_steps())
    assert [s for s, _, _ in got] == [0, 1]
    assert got[0][2] == [("data", clock.to_wall_ns(1), clock.to_wall_ns(2)), ("step", clock.to_wall_ns(1), clock.to_wall_ns(3))]
    timer.add_step(3, ModeKeys.EVAL, [("eval_step", 5, 6)])
    assert [s for s, _, _ in timer.ready_steps(wait=True)] == [3]


def _replayed_by_tracker(steps):
    """What a PhaseTracker gives for `steps` ((step, mode, events), tokens counted up)."""
    tracker, out, token = PhaseTracker(), [], 0
    for step, mode, events in steps:
        tracker.begin(mode, token)
        begin = token
        for event in events:
            token += 1
            tracker.event(event, token)
        token += 1
        _, spans = tracker.end(token)
        out.append((step, mode, [*spans, ("step" if mode is ModeKeys.TRAIN else "eval_step", begin, token)]))
    return out


def _log_steps(log, steps, token=int):
    t = 0
    for step, mode, events in steps:
        log.begin(step, mode, token(t))
        for event in events:
            t += 1
            log.event(event, token(t))
        t += 1
        log.end(token(t))


STEPS = [
    (0, ModeKeys.TRAIN, ["forward_begin", "forward_end", "optimizer_begin", "optimizer_end"]),
    (1, ModeKeys.TRAIN, ["forward_begin", "forward_end", "forward_begin", "forward_end", "optimizer_begin"]),
    (2, ModeKeys.EVAL, ["forward_begin", "forward_end"]),
]


def test_the_phase_log_replays_through_the_table():
    log = PhaseLog()
    _log_steps(log, STEPS)
    assert log.drain() == _replayed_by_tracker(STEPS)
    assert log.drain() == []
    with pytest.raises(ConfigError, match="unknown phase event 'fwd'"):
        log.event("fwd", 1)
    # An explicit phase, and a step cut in two by a drain in the middle of it.
    log.begin(7, ModeKeys.TRAIN, 0)
    log.enter("compute", 2)
    assert log.drain() == []
    log.end(5)
    assert log.drain() == [(7, ModeKeys.TRAIN, [("data", 0, 2), ("compute", 2, 5), ("step", 0, 5)])]


def test_a_begin_record_with_its_first_event_replays_as_the_two_records():
    # HookBase.begin_step(mode, event) logs one record for both (one append a step less).
    separate, combined = PhaseLog(), PhaseLog()
    separate.begin(3, ModeKeys.TRAIN, 10)
    separate.event("forward_begin", 14)
    combined.append((STEP_BEGIN_EVENT_RECORD, 3, ModeKeys.TRAIN, 10, EVENT_CODES["forward_begin"], 14))
    for log in (separate, combined):
        log.event("forward_end", 20)
        log.event("optimizer_begin", 31)
        log.end(40)
    expected = separate.drain()
    assert expected and combined.drain() == expected
    assert expected[0][2][0] == ("data", 10, 14)


class _Token:
    """A token that is not an integer (as a GPU clock's events are)."""

    def __init__(self, t: int) -> None:
        self.t = t

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Token) and other.t == self.t

    def __hash__(self) -> int:
        return self.t


def test_the_flat_log_and_the_object_log_replay_alike():
    flat, objects = PhaseLog(), PhaseLog(flat=False)
    assert isinstance(flat.records, list) and not isinstance(objects.records, list)
    _log_steps(flat, STEPS)
    _log_steps(objects, STEPS, token=_Token)
    expected = _replayed_by_tracker(STEPS)
    assert flat.drain() == expected
    assert [(step, mode, [(p, s.t, e.t) for p, s, e in spans]) for step, mode, spans in objects.drain()] == expected
    assert len(flat.records) == 0 and len(objects.records) == 0


def test_the_one_pass_wall_clock_drain_gives_what_the_tracker_and_clock_give():
    # drain_wall (the flush thread's path for a CPU clock) against drain() + to_wall_ns,
    # drained at every record boundary so that steps are cut between drains anywhere.
    clock = CpuClock()
    reference, fast = PhaseLog(), PhaseLog()
    _log_steps(reference, STEPS)
    _log_steps(fast, STEPS)
    fast.enter("compute", 10_000)  # an explicit phase outside any step: ignored by both
    reference.enter("compute", 10_000)
    expected = [(step, mode, [(p, clock.to_wall_ns(a), clock.to_wall_ns(b)) for p, a, b in spans]) for step, mode, spans in reference.drain()]
    records = list(fast.records)
    fast.records.clear()
    got = []
    i = 0
    while i < len(records):
        size = {0: 4, 1: 3, 2: 2, 3: 6}.get(records[i], 2)
        fast.records.extend(records[i:i + size])
        got += fast.drain_wall(clock.offset)
        i += size
    assert got == expected and len(got) == len(STEPS)
    # a step with its first event in the begin record, and explicit phases
    log = PhaseLog()
    log.append((STEP_BEGIN_EVENT_RECORD, 9, ModeKeys.TRAIN, 100, EVENT_CODES["forward_begin"], 110))
    log.enter("compute", 120)
    log.event("optimizer_begin", 130)
    log.end(150)
    assert log.drain_wall(5) == [(9, ModeKeys.TRAIN, [("data", 105, 115), ("forward", 115, 125), ("compute", 125, 135), ("optimizer", 135, 155), ("step", 105, 155)])]


def test_a_flat_log_nobody_drains_stays_bounded_and_recovers():
    log = PhaseLog(maxlen=1000)
    for step in range(2000):
        log.begin(step, ModeKeys.TRAIN, 10 * step)
        log.event("forward_begin", 10 * step + 1)
        log.end(10 * step + 5)
        log.bound()
        assert len(log.records) <= 1000 + 8
    steps = log.drain()
    assert steps and [s for s, _, _ in steps] == list(range(steps[0][0], 2000))  # the newest whole steps
    assert steps[-1][2] == [("data", 19990, 19991), ("forward", 19991, 19995), ("step", 19990, 19995)]


def test_the_phase_log_drained_while_a_thread_logs_loses_nothing():
    steps = [(i, ModeKeys.TRAIN, STEPS[0][2]) for i in range(20000)]
    log, got = PhaseLog(), []
    done = threading.Event()

    def drain():
        while not done.is_set():
            got.extend(log.drain())

    drainer = threading.Thread(target=drain)
    drainer.start()
    _log_steps(log, steps)
    done.set()
    drainer.join()
    got.extend(log.drain())
    assert got == _replayed_by_tracker(steps)


def test_a_train_step_opened_by_its_optimizer_has_no_data_phase():
    # No registered model's forward ran (a GAN's networks in a container whose own forward
    # never runs): the time before optimizer.step() holds the forward and backward, so it is
    # "compute", not a wait for data. A step opened by its forward keeps its "data" phase.
    from stepscope.capture.phases import COMPUTE, DATA, OPTIMIZER, PhaseLog, first_phase

    assert first_phase(ModeKeys.TRAIN, "optimizer_begin") == COMPUTE
    assert first_phase(ModeKeys.TRAIN, "forward_begin") == DATA
    assert first_phase(ModeKeys.EVAL, "optimizer_begin") == DATA
    for wall in (False, True):
        log = PhaseLog()
        log.append((STEP_BEGIN_EVENT_RECORD, 0, ModeKeys.TRAIN, 100, EVENT_CODES["optimizer_begin"], 160))
        log.end(170)
        log.append((STEP_BEGIN_EVENT_RECORD, 1, ModeKeys.TRAIN, 170, EVENT_CODES["forward_begin"], 175))
        log.end(200)
        steps = log.drain_wall(0) if wall else log.drain()
        first, second = ([(phase, end - start) for phase, start, end in spans] for _, _, spans in steps)
        assert first == [(COMPUTE, 60), (OPTIMIZER, 10), ("step", 70)], (wall, first)
        assert second[0] == (DATA, 5), (wall, second)
