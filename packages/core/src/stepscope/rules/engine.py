"""Runs rules: tensor rules over a trial step by step (after training, or following a
running job until its end marker), then whole-job rules once over what the job recorded.
Tensor rules of one run share a read cache, so each tensor is read once per step however
many rules look at it. A rule fires when it reports a violation; its actions run the first
time it does."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..exceptions import CorruptRecord, StoreError
from .base import JobRule, Rule, RuleEvaluationConditionMet
from .reading import MISSING, ReadCache, TensorReader, TensorRequest
from .report import RuleReport

logger = logging.getLogger("stepscope")

ProgressCallback = Callable[[int, "int | None", int], None]  # (steps done, steps known, step)

_MISSING = MISSING
_DIRECT = TensorReader()  # what Rule.finish reads through: the walk's cache holds only its last steps


def invoke_rule(rule: Rule, start_step: int = 0, end_step: int | None = None, raise_on_fire: bool = False, **options: Any) -> RuleReport:
    """Run one rule over global steps [start_step, end_step); `options` are run_rules'
    (watch, poll_interval, max_poll_interval, timeout, progress)."""
    return run_rules([rule], start_step, end_step, raise_on_fire=raise_on_fire, **options)[0]


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
    cache = cache or ReadCache()
    by_trial: dict[int, list[Rule]] = {}
    for rule in rules:
        if rule.kind == "tensor":
            by_trial.setdefault(id(rule.trial), []).append(rule)
    for group in by_trial.values():
        walk = _Walk(group, start_step, end_step, cache, raise_on_fire, progress)
        walk.run(watch, poll_interval, max_poll_interval, timeout)
        for rule in group:
            _finish(rule, walk.last_step, raise_on_fire)
    tensor_trials = [group[0].trial for group in by_trial.values()]
    for rule in rules:
        if isinstance(rule, JobRule):
            if not rule.bound and len(tensor_trials) == 1:
                rule.bind(tensor_trials[0])
            evaluate_job_rule(rule, raise_on_fire=raise_on_fire)
    return [rule.report for rule in rules]


def _finish(rule: Rule, last_step: int | None, raise_on_fire: bool) -> None:
    """A tensor rule's end of run (Rule.finish); a crash becomes an error in its report."""
    report = rule.report
    before = report.violations
    rule.use_reader(_DIRECT)
    try:
        rule.finish()
    except _MISSING:
        pass
    except (CorruptRecord, StoreError) as exc:
        report.error(f"end of run: unreadable data: {exc}")
    except Exception as exc:  # a broken (custom) rule must not stop the others
        logger.warning("stepscope: rule %s failed at the end of the run", rule.name, exc_info=True)
        report.error(f"end of run: {type(exc).__name__}: {exc}")
    if report.violations > before:
        _fired(rule, report.evidence[-1].step if report.evidence else last_step, raise_on_fire, first=before == 0)


def evaluate_job_rule(rule: JobRule, *, run_actions: bool = True, raise_on_fire: bool = False) -> None:
    """Evaluate a whole-job rule once (a crash becomes an error in its report), then run its
    actions if it fired."""
    before = rule.report.violations
    rule.evaluate_guarded()
    if rule.report.violations > before and run_actions:
        _fired(rule, None, raise_on_fire)


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
        before = report.violations
        rule.use_reader(self.cache)
        try:
            condition = rule.invoke_at_step(step)
        except _MISSING:
            condition = False
        except (CorruptRecord, StoreError) as exc:
            condition = False
            report.error(f"step {step}: unreadable data: {exc}")
        except Exception as exc:  # a broken (custom) rule must not stop the others
            condition = False
            if not report.errors:
                logger.warning("stepscope: rule %s failed at step %d", rule.name, step, exc_info=True)
            report.error(f"step {step}: {type(exc).__name__}: {exc}")
        if condition and report.violations == before:
            # A custom rule written for smdebug returns True without saying why.
            rule.violation(step, f"{rule.name}: condition met")
        report.steps_evaluated += 1
        report.first_step = step if report.first_step is None else min(report.first_step, step)
        report.last_step = step if report.last_step is None else max(report.last_step, step)
        if report.violations > before:
            _fired(rule, step, self.raise_on_fire, first=before == 0)

    def _idle(self, idle_s: float) -> None:
        for rule in self.rules:
            before = rule.report.violations
            try:
                condition = rule.check_idle(idle_s, self.last_step)
            except Exception as exc:
                rule.report.error(f"idle check: {type(exc).__name__}: {exc}")
                continue
            if condition and rule.report.violations == before:
                rule.violation(self.last_step, f"{rule.name}: condition met while idle")
            if rule.report.violations > before:
                _fired(rule, self.last_step, self.raise_on_fire, first=before == 0)


def _fired(rule: Rule, step: int | None, raise_on_fire: bool, first: bool = True) -> None:
    report = rule.report
    if first:
        where = report.evidence[0].where if report.evidence else "the whole job"
        message = report.evidence[0].message if report.evidence else ""
        logger.warning("stepscope: rule %s fired at %s: %s", rule.name, where, message)
        for action in rule.actions:
            try:
                action.trigger(rule, step)
            except Exception as exc:  # an action failing (a webhook down) must not stop the check
                logger.warning("stepscope: action %s of rule %s failed: %s", action, rule.name, exc)
                report.error(f"action {action}: {exc}")
    if raise_on_fire:
        raise RuleEvaluationConditionMet(rule.name, step if step is not None else -1, report)


__all__ = ["ReadCache", "invoke_rule", "run_rules", "evaluate_job_rule"]
