"""Stop requests, training side: when the ranks of a job stop after a rule asked them to.

A rule writes a stop request into the job's store (control.request_stop); a poller thread
sees it (control.StopPoller). The step driver counts ended TRAIN steps in the counters
(`train_ends`) and asks the `StopCoordinator` only at `stop_check_at`: a rank deciding
alone decides at its next TRAIN step end; ranks that can agree through a collective agree
every $STEPSCOPE_STOP_AGREE_STEPS steps, so every rank stops at the same TRAIN step.

The same seam serves on-demand requests (control.send_request: a memory snapshot, a peer's
black box): the poller lowers `stop_check_at` so that the next TRAIN step end asks the
coordinator, which hands the request to `on_control` on the training thread; steps pay
nothing more than the comparison they already make."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ..exceptions import ConfigError, StepscopeError
from .control import StopPoller
from .step_counters import NEVER

logger = logging.getLogger("stepscope")

STOP_POLL_ENV = "STEPSCOPE_STOP_POLL_S"
STOP_AGREE_ENV = "STEPSCOPE_STOP_AGREE_STEPS"


class StopTrainingRequested(StepscopeError, RuntimeError):
    """Raised by a plain-loop hook at the end of a TRAIN step after a rule asked to stop
    (callbacks stop through their framework instead: `trainer.should_stop`,
    `model.stop_training`)."""


def poll_interval_from_env() -> float:
    """How often hooks look for a stop request: $STEPSCOPE_STOP_POLL_S seconds, default 2
    (one stat or HEAD request per interval, off the training thread)."""
    raw = os.environ.get(STOP_POLL_ENV, "2.0")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{STOP_POLL_ENV} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ConfigError(f"{STOP_POLL_ENV} must be > 0, got {raw!r}")
    return value


def agree_steps_from_env() -> int:
    """Every how many TRAIN steps the ranks of a multi-rank job agree on stopping:
    $STEPSCOPE_STOP_AGREE_STEPS, default 8 (one one-integer all-reduce per interval)."""
    raw = os.environ.get(STOP_AGREE_ENV, "8")
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{STOP_AGREE_ENV} must be a whole number of TRAIN steps, got {raw!r}") from None
    if value < 1:
        raise ConfigError(f"{STOP_AGREE_ENV} must be >= 1, got {raw!r}")
    return value


class StopCoordinator:
    """Decides at `counters.stop_check_at` whether training stops. `can_agree()` (asked
    once, at the first decision) and `agree(local)` are the plugin's collective (see
    `HookBase._can_agree_on_stop` / `_agree_on_stop`); `enabled()` says whether the hook is
    still on."""

    def __init__(self, counters: Any, agree_every: int, can_agree: Callable[[], bool], agree: Callable[[bool], bool], enabled: Callable[[], bool]):
        self._counters = counters
        self.poller: StopPoller | None = None
        self.agreeing: bool | None = None  # None until the first decision says which
        self.agreed = False
        self._agree_next = 1  # the next agreement step (only the training thread sets it)
        self._agree_every = agree_every
        self._can_agree, self._agree, self._enabled = can_agree, agree, enabled
        self._raised = False
        # The plugin's: an on-demand request at a TRAIN step end, and the stop exception
        # just before it is raised (the black box); each guarded, never raising into training.
        self.on_control: Callable[[dict[str, Any]], None] | None = None
        self.before_raise: Callable[[BaseException], None] | None = None
        self.training_thread: threading.Thread | None = None  # the thread that ends TRAIN steps (known from the first decision)

    def start(self, store: Any, interval_s: float) -> StopPoller:
        self.poller = StopPoller(store, interval_s, on_request=self.on_request, on_control=self.on_control_request)
        return self.poller

    def on_control_request(self) -> None:
        # The poller's thread: the next TRAIN step end asks `decide`, which serves it.
        self._counters.stop_check_at = 0

    @property
    def requested(self) -> bool:
        """True once a rule asked the job to stop; for ranks that agree, from the TRAIN step
        at which all ranks agreed."""
        if self.agreeing:
            return self.agreed
        return self.poller is not None and self.poller.stop_requested

    def on_request(self) -> None:
        # The poller's thread: a rank deciding alone decides at the next TRAIN step end.
        if not self.agreeing:
            self._counters.stop_check_at = 0

    def decide(self, n: int) -> bool:
        """Whether training stops at the end of the `n`-th TRAIN step (n >= stop_check_at);
        serves a waiting on-demand request first."""
        self.training_thread = threading.current_thread()  # (the black box tells the training thread's death from another's)
        stop = self._decide(n)
        # After `stop_check_at` is set: a request the poller leaves now lowers it again.
        poller = self.poller
        request = poller.take_control() if poller is not None else None
        if request is not None and self.on_control is not None:
            try:
                self.on_control(request)
            except Exception as exc:  # a request must never break training
                logger.warning("stepscope: the %s request failed: %r", request.get("action"), exc)
        return stop

    def _decide(self, n: int) -> bool:
        counters = self._counters
        if counters.closed or self.poller is None:
            counters.stop_check_at = NEVER
            return False
        if self.agreeing is None:
            try:
                self.agreeing = bool(self._can_agree())
            except Exception as exc:  # a broken detection: decide alone, as before
                logger.warning("stepscope: cannot agree on stopping with other ranks: %r", exc)
                self.agreeing = False
        if not self.agreeing:
            # Park first, then read: a request the poller sets in between lowers it again.
            counters.stop_check_at = NEVER
            if self.poller.request is None:
                return False
        elif not self.agreed:
            if n < self._agree_next:  # woken early by the poller (it raced the first decision)
                counters.stop_check_at = self._agree_next
                return False
            every = self._agree_every
            # The next multiple of `every`: the same TRAIN step on every rank.
            self._agree_next = counters.stop_check_at = (n // every + 1) * every
            # Every rank runs this collective at the same step; a failure here (a peer gone)
            # is the job's failure and is not hidden.
            self.agreed = bool(self._agree(self.poller.request is not None))
            if not self.agreed:
                return False
        counters.stop_check_at = n + 1  # stopping: so at every following TRAIN step end too
        return True

    def raise_stop(self) -> None:
        """Raise StopTrainingRequested (once): `decide()` said to stop."""
        # A rank whose hook turned off stops too once the ranks agreed: alone, it would wait
        # for its stopped peers in the next all-reduce.
        if not self._raised and (self._enabled() or self.agreeing):
            self._raised = True
            request = self.poller.request if self.poller is not None else None
            if request is None and self.agreeing:
                request = {"action": "StopTraining", "reason": "another rank saw the request; all ranks agreed"}
            exc = StopTrainingRequested(f"stepscope: a rule asked to stop training ({request})")
            if self.before_raise is not None:
                try:
                    self.before_raise(exc)
                except Exception as failure:  # the stop goes on whatever the black box did
                    logger.warning("stepscope: before the stop: %r", failure)
            raise exc


__all__ = ["STOP_AGREE_ENV", "STOP_POLL_ENV", "StopCoordinator", "StopTrainingRequested", "agree_steps_from_env", "poll_interval_from_env"]
