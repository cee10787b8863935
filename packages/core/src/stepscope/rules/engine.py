"""Runs rules over a trial step by step: after training, or following a running job until
its end marker. Rules of one run share a read cache, so each tensor is read once per step
however many rules look at it."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..exceptions import CorruptRecord, StepNotYetAvailable, StepUnavailable, StoreError, TensorUnavailable, TensorUnavailableForStep
from .base import Rule, RuleEvaluationConditionMet, RuleReport, TensorRequest, read_reduction

if TYPE_CHECKING:
    from ..trial import Trial

logger = logging.getLogger("stepscope")

ProgressCallback = Callable[[int, "int | None", int], None]  # (steps done, steps known, step)

_MISSING = (TensorUnavailable, TensorUnavailableForStep, StepUnavailable, StepNotYetAvailable)
MAX_FIRED_STEPS = 1000
MAX_ERRORS = 20


class ReadCache:
    """Raw values and reductions read at the last `keep_steps` steps, keyed by trial, tensor
    and global step. Rules that need older values keep them themselves."""

    def __init__(self, keep_steps: int = 2):
        self.keep_steps = keep_steps
        self._recent: deque[int] = deque(maxlen=keep_steps)
        self._values: dict[tuple[int, str, int], np.ndarray | None] = {}
        self._reductions: dict[tuple[int, str, int, str, bool], float | None] = {}
        self.reads = 0  # values fetched from the store (directly or by prefetch)
        self.hits = 0

    def start_step(self, step: int) -> None:
        if step in self._recent:
            return
        self._recent.append(step)
        keep = set(self._recent)
        self._values = {k: v for k, v in self._values.items() if k[2] in keep}
        self._reductions = {k: v for k, v in self._reductions.items() if k[2] in keep}

    def value(self, trial: Trial, name: str, step: int) -> np.ndarray | None:
        key = (id(trial), name, step)
        if key in self._values:
            self.hits += 1
            return self._values[key]
        array = None
        if trial.has_tensor(name):
            try:
                array = trial.tensor(name).value(step)
                self.reads += 1
            except _MISSING:
                array = None
        self._values[key] = array
        return array

    def reduction(self, trial: Trial, name: str, step: int, reduction: str, abs: bool) -> float | None:
        key = (id(trial), name, step, reduction, abs)
        if key not in self._reductions:
            self._reductions[key] = read_reduction(trial, name, step, reduction, abs, lambda n, s: self.value(trial, n, s))
        else:
            self.hits += 1
        return self._reductions[key]

    def prefetch(self, trial: Trial, requests: Iterable[TensorRequest]) -> None:
        """Read every value the requests need that is not cached yet, in one batch."""
        from ..reductions import reduction_tensor_name

        wanted: dict[tuple[str, int], None] = {}
        for request in requests:
            names = [request.name]
            if request.reduction is not None:
                base = request.reduction[: -len("_norm")] if request.reduction.endswith("_norm") else request.reduction
                spellings = (base, f"{base}_norm") if base in ("l1", "l2") else (base,)
                saved = [reduction_tensor_name(request.name, s, request.abs) for s in spellings]
                saved = [n for n in saved if trial.has_tensor(n)]
                names = saved[:1] or names
            for name in names:
                if (id(trial), name, request.step) not in self._values and trial.has_tensor(name):
                    wanted[(name, request.step)] = None
        if not wanted:
            return
        keys = list(wanted)
        arrays = trial.read_many([(name, step, None, None) for name, step in keys])
        for (name, step), array in zip(keys, arrays):
            self._values[(id(trial), name, step)] = array
            self.reads += array is not None


def invoke_rule(
    rule: Rule,
    start_step: int = 0,
    end_step: int | None = None,
    raise_on_fire: bool = False,
    *,
    watch: bool = False,
    poll_interval: float = 0.1,
    max_poll_interval: float = 5.0,
    timeout: float | None = None,
    progress: ProgressCallback | None = None,
) -> RuleReport:
    """Run one rule over global steps [start_step, end_step); see `run_rules`."""
    return run_rules(
        [rule], start_step, end_step, raise_on_fire=raise_on_fire, watch=watch,
        poll_interval=poll_interval, max_poll_interval=max_poll_interval, timeout=timeout, progress=progress,
    )[0]


def run_rules(
    rules: Sequence[Rule],
    start_step: int = 0,
    end_step: int | None = None,
    *,
    raise_on_fire: bool = False,
    watch: bool = False,
    poll_interval: float = 0.1,
    max_poll_interval: float = 5.0,
    timeout: float | None = None,
    progress: ProgressCallback | None = None,
    cache: ReadCache | None = None,
) -> list[RuleReport]:
    """Run `rules` together over the global steps [start_step, end_step) of their trials.

    Steps are walked in order; at each step every rule is invoked after the tensors they
    declared are fetched in one batch. Missing tensors or steps make a rule skip that step.
    With `watch=True` the run follows a job that is still writing: it polls
    `trial.refresh()` with exponential backoff (poll_interval doubling up to
    max_poll_interval, reset when new steps arrive) until the end marker, `end_step`, or
    `timeout` seconds. A rule's actions run the first time it fires. With `raise_on_fire`,
    the first firing raises RuleEvaluationConditionMet."""
    rules = list(rules)
    by_trial: dict[int, list[Rule]] = {}
    for rule in rules:
        by_trial.setdefault(id(rule.trial), []).append(rule)
    cache = cache or ReadCache()
    for group in by_trial.values():
        _Walk(group, start_step, end_step, cache, raise_on_fire, progress).run(watch, poll_interval, max_poll_interval, timeout)
    return [rule.report for rule in rules]


class _Walk:
    def __init__(self, rules: list[Rule], start: int, end: int | None, cache: ReadCache, raise_on_fire: bool, progress: ProgressCallback | None):
        self.rules, self.start, self.end, self.cache = rules, start, end, cache
        self.trial = rules[0].trial
        self.raise_on_fire = raise_on_fire
        self.progress = progress
        self.done: set[int] = set()
        self.last_step: int | None = None

    def _pending(self) -> list[int]:
        return [s for s in self.trial.steps() if s >= self.start and (self.end is None or s < self.end) and s not in self.done]

    def run(self, watch: bool, poll_interval: float, max_poll_interval: float, timeout: float | None) -> None:
        self.trial.refresh()
        started = time.monotonic()
        last_new = started
        delay = poll_interval
        while True:
            pending = self._pending()
            for i, step in enumerate(pending):
                self._step(step)
                if self.progress is not None:
                    self.progress(len(self.done), len(self.done) + len(pending) - i - 1, step)
            if pending:
                last_new = time.monotonic()
            if not watch or self._finished():
                return
            if timeout is not None and time.monotonic() - started >= timeout:
                logger.info("stepscope: stopped following %s after %.0f s (timeout)", self.trial.path, timeout)
                return
            time.sleep(delay if timeout is None else max(0.0, min(delay, started + timeout - time.monotonic())))
            if self.trial.refresh():
                delay = poll_interval
            else:
                delay = min(delay * 2, max_poll_interval)
                self._idle(time.monotonic() - last_new)

    def _finished(self) -> bool:
        if self.end is not None and self.last_step is not None and self.last_step >= self.end - 1:
            return True
        # refresh() looks once more after it first sees the end marker, so once the trial
        # is complete and nothing is pending, nothing more will come.
        return self.trial.is_complete() and not self._pending()

    def _step(self, step: int) -> None:
        self.cache.start_step(step)
        requests: list[TensorRequest] = []
        for rule in self.rules:
            try:
                requests.extend(rule.required_tensors(step))
            except _MISSING:
                pass
        try:
            self.cache.prefetch(self.trial, requests)
        except (CorruptRecord, StoreError) as exc:
            # Fall back to reading one by one so one bad record only costs the rules that need it.
            logger.warning("stepscope: batched read at step %d failed (%s); reading tensors one by one", step, exc)
        for rule in self.rules:
            self._invoke(rule, step)
        self.done.add(step)
        self.last_step = step if self.last_step is None else max(self.last_step, step)

    def _invoke(self, rule: Rule, step: int) -> None:
        report = rule.report
        rule._cache = self.cache
        try:
            fired = bool(rule.invoke_at_step(step))
        except _MISSING:
            fired = False
        except (CorruptRecord, StoreError) as exc:
            fired = False
            _error(report, f"step {step}: unreadable data: {exc}")
        except Exception as exc:  # a broken (custom) rule must not stop the others
            fired = False
            if not report.errors:
                logger.warning("stepscope: rule %s failed at step %d", rule.name, step, exc_info=True)
            _error(report, f"step {step}: {type(exc).__name__}: {exc}")
        finally:
            rule._cache = None
        report.steps_evaluated += 1
        report.first_step = step if report.first_step is None else min(report.first_step, step)
        report.last_step = step if report.last_step is None else max(report.last_step, step)
        report.tensors_inspected = len(rule._inspected)
        if fired:
            self._fired(rule, step)

    def _idle(self, idle_s: float) -> None:
        for rule in self.rules:
            try:
                fired = rule.check_idle(idle_s, self.last_step)
            except Exception as exc:
                _error(rule.report, f"idle check: {type(exc).__name__}: {exc}")
                continue
            if fired:
                self._fired(rule, self.last_step if self.last_step is not None else -1)

    def _fired(self, rule: Rule, step: int) -> None:
        report = rule.report
        first = not report.fired
        report.fired = True
        if len(report.fired_steps) < MAX_FIRED_STEPS and step not in report.fired_steps:
            report.fired_steps.append(step)
        if first:
            logger.warning("stepscope: rule %s fired at step %d: %s", rule.name, step, report.details[-1]["message"] if report.details else "")
            for action in rule.actions:
                try:
                    action.trigger(rule, step)
                except Exception as exc:  # an action failing (a webhook down) must not stop the check
                    logger.warning("stepscope: action %s of rule %s failed: %s", action, rule.name, exc)
                    _error(report, f"action {action}: {exc}")
        if self.raise_on_fire:
            raise RuleEvaluationConditionMet(rule.name, step, report)


def _error(report: RuleReport, message: str) -> None:
    if len(report.errors) < MAX_ERRORS:
        report.errors.append(message)


__all__ = ["ReadCache", "invoke_rule", "run_rules"]
