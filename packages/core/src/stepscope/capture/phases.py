"""Where the time of a step goes, framework-free: a phase tracker (a state machine whose
transitions are the table `TRANSITIONS`) and a step timer that turns clock readings into
wall-clock spans once the clock can tell them (at once on CPU; later for GPU events).

Every instant between a step's begin and its end lies in exactly one phase: a step's
phases tile it, with "other" for time no event explains. So the timeline accounts for the
whole of every step, in every plugin."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..exceptions import ConfigError
from ..modes import ModeKeys

DATA, FORWARD, BACKWARD, OPTIMIZER, COMPUTE, OTHER = "data", "forward", "backward", "optimizer", "compute", "other"
PHASES = (DATA, FORWARD, BACKWARD, OPTIMIZER, COMPUTE, OTHER)

# Events a plugin reports; each moves the tracker to the phase the table says.
FORWARD_BEGIN, FORWARD_END = "forward_begin", "forward_end"
BACKWARD_BEGIN, BACKWARD_END = "backward_begin", "backward_end"
OPTIMIZER_BEGIN, OPTIMIZER_END = "optimizer_begin", "optimizer_end"
EVENTS = (FORWARD_BEGIN, FORWARD_END, BACKWARD_BEGIN, BACKWARD_END, OPTIMIZER_BEGIN, OPTIMIZER_END)

# (training step?, event) -> the phase that starts. A step starts in "data" (the wait for
# the batch, since the previous step ended). A begin event starts its phase and an end
# event "other", in every mode, but for one: in a training step the time after a forward
# is its backward until something else is said.
_STARTS = {FORWARD_BEGIN: FORWARD, BACKWARD_BEGIN: BACKWARD, OPTIMIZER_BEGIN: OPTIMIZER}
_STARTS |= {event: OTHER for event in (FORWARD_END, BACKWARD_END, OPTIMIZER_END)}
TRANSITIONS: Mapping[tuple[bool, str], str] = {
    **{(training, event): phase for training in (True, False) for event, phase in _STARTS.items()},
    (True, FORWARD_END): BACKWARD,
}

# A whole step of each mode, as the step timeline names its span (the phases above tile it).
STEP_PHASES = ("step", "eval_step", "predict_step")
STEP_PHASE = {ModeKeys.TRAIN: "step", ModeKeys.EVAL: "eval_step", ModeKeys.PREDICT: "predict_step", ModeKeys.GLOBAL: "step"}
# Every phase name a span of the step timeline may carry: the parts of a step, then whole steps.
TIMELINE_PHASES = (*PHASES, *STEP_PHASES)

# (phase, start token, end token); tokens are whatever the clock's `now()` returns.
Span = tuple[str, Any, Any]


class Clock(Protocol):
    """Reads time as tokens and turns them into wall-clock ns once they are known.
    `immediate`: tokens are known at once (nothing to wait for; `to_wall_ns` may still
    convert them, off the training thread)."""

    immediate: bool

    def now(self) -> Any: ...

    def ready(self, token: Any) -> bool: ...

    def wait(self, token: Any) -> None: ...

    def to_wall_ns(self, token: Any) -> int: ...


class CpuClock:
    """Tokens are plain `time.perf_counter_ns()` readings (the steady counter: the cheapest
    reading there is), known at once; `to_wall_ns` moves them onto the wall clock (anchored
    once to `time.time_ns()`)."""

    immediate = True
    int_tokens = True  # a PhaseLog can keep them as plain ints (no object per record)

    def __init__(self) -> None:
        self.offset = time.time_ns() - time.perf_counter_ns()  # wall-clock ns = token + offset
        self.now = time.perf_counter_ns  # type: ignore[method-assign] # no Python frame per reading

    def now(self) -> Any:
        return time.perf_counter_ns()

    def ready(self, token: Any) -> bool:
        return True

    def wait(self, token: Any) -> None:
        return None

    def to_wall_ns(self, token: Any) -> int:
        return int(token) + self.offset


class PhaseTracker:
    """The phases of the open step. `begin(mode, token)` opens a step in "data";
    `event(name, token)` or `enter(phase, token)` closes the current phase and opens the
    next; `end(token)` closes the step and returns its spans, which tile [begin, end]."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self._training = False
        self._since: Any = None
        self._begin: Any = None
        self._spans: list[Span] = []

    @property
    def open(self) -> bool:
        return self.phase is not None

    def begin(self, mode: ModeKeys, token: Any) -> None:
        self.phase, self._training = DATA, mode == ModeKeys.TRAIN
        self._since = self._begin = token
        self._spans = []

    def event(self, name: str, token: Any) -> None:
        """Move to the phase the table gives for `name` (unknown names: ConfigError)."""
        try:
            phase = TRANSITIONS[(self._training, name)]
        except KeyError:
            raise ConfigError(f"unknown phase event {name!r}; events: {', '.join(EVENTS)}") from None
        self.enter(phase, token)

    def enter(self, phase: str, token: Any) -> None:
        if self.phase is None or phase == self.phase:
            return
        self._spans.append((self.phase, self._since, token))
        self.phase, self._since = phase, token

    def end(self, token: Any) -> tuple[Any, list[Span]]:
        """Close the step at `token`: (its begin token, its phase spans)."""
        if self.phase is None:
            return None, []
        self._spans.append((self.phase, self._since, token))
        spans, begin = self._spans, self._begin
        self.phase, self._spans, self._since, self._begin = None, [], None, None
        return begin, spans


@dataclass
class _TimedStep:
    step: int
    mode: ModeKeys
    spans: list[Span] = field(default_factory=list)


class StepTimer:
    """Steps' spans in clock tokens, handed back in wall-clock ns once the clock knows them
    (in order: a GPU finishes steps in order, so the first unfinished one stops the walk)."""

    def __init__(self, clock: Clock | None = None):
        self.clock: Clock = clock or CpuClock()
        self._pending: deque[_TimedStep] = deque()

    def add_step(self, step: int, mode: ModeKeys, spans: list[Span]) -> None:
        if spans:
            self._pending.append(_TimedStep(step, mode, spans))

    def ready_steps(self, wait: bool = False) -> Iterator[tuple[int, ModeKeys, list[tuple[str, int, int]]]]:
        clock = self.clock
        while self._pending:
            timed = self._pending[0]
            last = timed.spans[-1][2]
            if not clock.ready(last):
                if not wait:
                    return
                clock.wait(last)
            self._pending.popleft()
            yield timed.step, timed.mode, [(phase, clock.to_wall_ns(s), clock.to_wall_ns(e)) for phase, s, e in timed.spans]


# Records of a PhaseLog. All integers (events and phases by their codes), so that with a
# clock whose tokens are integers (`CpuClock`) the log is one flat list of ints: the tuple
# the training thread appends is freed at once, and what lives until the drain are ints,
# which the garbage collector does not track (a deque of tuples gave it ~4 tracked objects
# a step). A list rather than an `array("q")`: array.extend parses each item with
# PyArg_Parse, several times dearer. Public for the hot paths that append to the log
# directly (HookBase, the torch plugin).
STEP_BEGIN_RECORD = 0  # (0, step, mode, token)
PHASE_ENTER_RECORD = 1  # (1, phase code, token)
STEP_END_RECORD = 2  # (2, token)
STEP_BEGIN_EVENT_RECORD = 3  # (3, step, mode, token, event code, event token): a step and its first event
EVENT_CODES: Mapping[str, int] = {name: 10 + i for i, name in enumerate(EVENTS)}  # (event code, token)
PHASE_CODES: Mapping[str, int] = {name: i for i, name in enumerate(PHASES)}
_BEGIN, _ENTER, _END, _BEGIN_EVENT = STEP_BEGIN_RECORD, PHASE_ENTER_RECORD, STEP_END_RECORD, STEP_BEGIN_EVENT_RECORD
EVENT_OF_CODE: Mapping[int, str] = {code: name for name, code in EVENT_CODES.items()}
_FIRST_EVENT_CODE = min(EVENT_OF_CODE)
_OPTIMIZER_BEGIN_CODE = EVENT_CODES[OPTIMIZER_BEGIN]


def first_phase(mode: ModeKeys, first_event: str) -> str:
    """The phase of a step from its begin to its first event. A TRAIN step whose first event
    is the optimizer's (no registered model's forward ran: a model the hook does not see,
    a GAN's networks wrapped in a container whose own forward never runs) spent that time
    on its forward and backward as well as any wait for data: "compute", never "data"."""
    return COMPUTE if mode == ModeKeys.TRAIN and first_event == OPTIMIZER_BEGIN else DATA
_TRAIN_PHASE_AFTER = {code: TRANSITIONS[(True, name)] for code, name in EVENT_OF_CODE.items()}
_EVAL_PHASE_AFTER = {code: TRANSITIONS[(False, name)] for code, name in EVENT_OF_CODE.items()}
_RECORD_WORDS = {_BEGIN: 4, _ENTER: 3, _END: 2, _BEGIN_EVENT: 6, **{code: 2 for code in EVENT_OF_CODE}}
_MODES = {int(mode): mode for mode in ModeKeys}
_MAX_LOGGED_WORDS = 1 << 21  # bounds memory when nothing drains the log (then the oldest go)


def _event_code(event: str | int) -> int:
    if type(event) is int:
        return event
    code = EVENT_CODES.get(event)  # type: ignore[arg-type]
    if code is None:
        raise ConfigError(f"unknown phase event {event!r}; events: {', '.join(EVENTS)}")
    return code


class Words(list[int]):
    """The words of a flat PhaseLog: a list of ints whose `take()` removes and returns the
    words so far. The training thread appends a whole record in one C call (`extend`), only
    ever at the end, and `take()` removes just the words it copied: a drain on another
    thread never sees half a record. A compiled plugin brings its own, of the same two
    methods (stepscope_torch's `_fastpath.Words`, int64s: a record is no object)."""

    def take(self) -> list[int]:
        n = len(self)
        values = self[:n]
        del self[:n]  # (what was appended meanwhile stays: only ever at the end)
        return values


class PhaseLog:
    """The training thread's side of the step timeline: one record appended per step
    boundary or phase event (one C call: atomic, no lock, no call into stepscope), and
    `drain()`, which replays what was logged through a `PhaseTracker` (the table) into
    steps' spans, off the training thread when the clock's tokens are known at once.

    `flat` (a clock with integer tokens): the records are words of one `Words` (or the
    `words` given, of the same methods) and `append` is its `extend`; otherwise (GPU events
    as tokens) each record is a tuple in a deque. Either way `append(record)` takes the
    record as a tuple (see the *_RECORD constants). `bound()` drops the oldest records
    beyond `maxlen` words (flat) or records (a deque bounds itself). `begin` / `event` /
    `enter` / `end` append one record each (what the step driver calls; a compiled hot path
    appends the same records itself)."""

    def __init__(self, maxlen: int = _MAX_LOGGED_WORDS, flat: bool = True, words: Any = None) -> None:
        self.flat = flat
        self.maxlen = maxlen
        self.records: Any = (Words() if words is None else words) if flat else deque(maxlen=maxlen)
        self.append: Any = self.records.extend if flat else self.records.append
        self._tracker = PhaseTracker()
        self._open: tuple[int, ModeKeys] | None = None
        self._lock = threading.Lock()  # drains come from the flush thread and from close()

    # The records, one call each: the step driver writes them (on the training thread) and
    # tests replay them. Events and phases by name or by code (EVENT_CODES, PHASE_CODES).

    def begin(self, step: int, mode: ModeKeys, token: Any, event: str | int | None = None, event_token: Any = None) -> None:
        """Step `step` of `mode` begins at `token` (in "data"); with `event`, that event
        happens at `event_token` (one record for both)."""
        if event is None:
            self.append((_BEGIN, step, mode, token))
        else:
            self.append((_BEGIN_EVENT, step, mode, token, _event_code(event), event_token))

    def event(self, event: str | int, token: Any) -> None:
        self.append((_event_code(event), token))

    def enter(self, phase: str | int, token: Any) -> None:
        self.append((_ENTER, phase if type(phase) is int else PHASE_CODES[phase], token))  # type: ignore[index]

    def end(self, token: Any) -> None:
        self.append((_END, token))

    def bound(self) -> None:
        """Drop the oldest whole records while the flat log holds more than `maxlen` words
        (nothing drained it: a stalled timeline must not grow without end)."""
        if not self.flat or len(self.records) <= self.maxlen:
            return
        with self._lock:  # (on the training thread: no record is appended meanwhile)
            words, i = self.records.take(), 0
            while len(words) - i > self.maxlen // 2:
                i += _RECORD_WORDS[words[i]]
            self.records.extend(words[i:])
            self._open = None  # the open step's begin may be gone
            self._tracker = PhaseTracker()

    def drain(self) -> list[tuple[int, ModeKeys, list[Span]]]:
        """The steps whose timing ended since the last drain: (step, mode, spans in clock
        tokens), the phases tiling the step followed by the whole step's span."""
        out: list[tuple[int, ModeKeys, list[Span]]] = []
        with self._lock:
            if not self.flat:
                pop = self.records.popleft
                while True:
                    try:
                        self._replay(pop(), out)
                    except IndexError:
                        return out
            # The training thread only ever extends the words at their end, a whole record
            # at a time (one C call): what is taken holds whole records.
            values = self.records.take()
            n = len(values)
            i = 0
            while i < n:
                size = _RECORD_WORDS[values[i]]
                self._replay(values[i:i + size], out)
                i += size
            return out

    def drain_wall(self, offset: int) -> list[tuple[int, ModeKeys, list[tuple[str, int, int]]]]:
        """`drain()` of a flat log whose tokens are ns `offset` ns behind the wall clock
        (CpuClock): the spans already in wall-clock ns, in one pass with the phase table
        inlined. The timeline's flush thread runs this for every step of the job, so it
        costs a few µs a step where replaying through the tracker cost ~20. A log is drained
        one way or the other, not both."""
        out: list[tuple[int, ModeKeys, list[tuple[str, int, int]]]] = []
        with self._lock:
            values = self.records.take()
            n = len(values)
            tracker = self._tracker
            phase, training, since, begin, spans, opened = tracker.phase, tracker._training, tracker._since, tracker._begin, tracker._spans, self._open
            i = 0
            while i < n:
                kind = values[i]
                if kind >= _FIRST_EVENT_CODE:  # an event: to the phase the table gives
                    if phase is not None:
                        following = (_TRAIN_PHASE_AFTER if training else _EVAL_PHASE_AFTER)[kind]
                        if following != phase:
                            t = values[i + 1] + offset
                            spans.append((phase, since, t))
                            phase, since = following, t
                    i += 2
                elif kind == _END:
                    if phase is not None:
                        t = values[i + 1] + offset
                        spans.append((phase, since, t))
                        if opened is not None:
                            spans.append((STEP_PHASE[opened[1]], begin, t))
                            out.append((opened[0], opened[1], spans))
                    phase, spans, opened = None, [], None
                    i += 2
                elif kind == _ENTER:
                    entered = PHASES[values[i + 1]]
                    if phase is not None and entered != phase:
                        t = values[i + 2] + offset
                        spans.append((phase, since, t))
                        phase, since = entered, t
                    i += 3
                else:  # a step begins (and, with _BEGIN_EVENT, its first event happens)
                    mode = _MODES[values[i + 2]]
                    opened, training = (values[i + 1], mode), mode == ModeKeys.TRAIN
                    phase, spans = DATA, []
                    since = begin = values[i + 3] + offset
                    if kind == _BEGIN_EVENT and training and values[i + 4] == _OPTIMIZER_BEGIN_CODE:
                        phase = COMPUTE  # no forward seen: see `first_phase`
                    if kind == _BEGIN_EVENT:
                        following = (_TRAIN_PHASE_AFTER if training else _EVAL_PHASE_AFTER)[values[i + 4]]
                        if following != phase:
                            t = values[i + 5] + offset
                            spans.append((phase, since, t))
                            phase, since = following, t
                        i += 6
                    else:
                        i += 4
            tracker.phase, tracker._training, tracker._since, tracker._begin, tracker._spans, self._open = phase, training, since, begin, spans, opened
        return out

    def _replay(self, record: Any, out: list[tuple[int, ModeKeys, list[Span]]]) -> None:
        kind, tracker = record[0], self._tracker
        if kind == _BEGIN or kind == _BEGIN_EVENT:
            step, mode = record[1], _MODES[record[2]]
            self._open = (step, mode)
            tracker.begin(mode, record[3])
            if kind == _BEGIN_EVENT:
                tracker.phase = first_phase(mode, EVENT_OF_CODE[record[4]])
                tracker.event(EVENT_OF_CODE[record[4]], record[5])
        elif kind == _END:
            begin, spans = tracker.end(record[1])
            if self._open is not None and spans:
                step, mode = self._open
                spans.append((STEP_PHASE[mode], begin, record[1]))
                out.append((step, mode, spans))
            self._open = None
        elif kind == _ENTER:
            tracker.enter(PHASES[record[1]], record[2])
        elif tracker.open:
            tracker.event(EVENT_OF_CODE[kind], record[1])

