"""The rule engine: shared reads, tolerance of missing data, raise_on_fire, errors kept in
reports, and following a running job (watch) up to stopping it."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from stepscope import create_trial
from stepscope.capture.collection_manager import CollectionManager
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys
from stepscope.rules import (
    AllZero,
    ExplodingTensor,
    Rule,
    RuleEvaluationConditionMet,
    VanishingGradient,
    invoke_rule,
    run_rules,
)
from stepscope.store.local import LocalStore

GRADIENTS = [f"gradient/layer{i}.weight" for i in range(4)]


class CountingStore(LocalStore):
    """A local store that counts ranged reads (one per tensor value read)."""

    def __init__(self, root):
        super().__init__(root)
        self.range_reads = 0

    def read_range(self, key, start, length):
        self.range_reads += 1
        return super().read_range(key, start, length)


def write_job(out_dir, steps: int = 10, gradient_every: int = 1, bad_step: int | None = None, close: bool = True) -> Writer:
    rng = np.random.default_rng(0)
    writer = Writer(str(out_dir))
    manager = CollectionManager(builtin_regexes={"gradients": ["^gradient"], "losses": ["loss"]})
    writer.write_collections(manager.dumps())
    for step in range(steps):
        tensors = {"loss": np.float32(1.0 / (step + 1))}
        if step % gradient_every == 0:
            for name in GRADIENTS:
                value = rng.standard_normal((8, 8)).astype(np.float32)
                if step == bad_step:
                    value[0, 0] = np.nan
                tensors[name] = value
        writer.write_step(step, ModeKeys.TRAIN, step, tensors)
    if close:
        writer.close()
    else:
        writer.flush()
    return writer


def test_rules_of_a_run_read_each_tensor_once(tmp_path):
    write_job(tmp_path, steps=10)
    together = CountingStore(tmp_path)
    trial = create_trial(together, cache_size=0)
    rules = [VanishingGradient(trial), ExplodingTensor(trial, collection_names="gradients"), AllZero(trial, collection_names="gradients")]
    run_rules(rules)
    assert together.range_reads == 10 * len(GRADIENTS)

    apart = CountingStore(tmp_path)
    trial = create_trial(apart, cache_size=0)
    for rule in (VanishingGradient(trial), ExplodingTensor(trial, collection_names="gradients"), AllZero(trial, collection_names="gradients")):
        invoke_rule(rule)
    assert apart.range_reads == 3 * 10 * len(GRADIENTS)


def test_missing_tensors_and_steps_are_skipped(tmp_path):
    write_job(tmp_path, steps=9, gradient_every=3)
    report = invoke_rule(VanishingGradient(create_trial(str(tmp_path))))
    assert report.steps_evaluated == 9 and not report.errors and not report.fired
    assert report.tensors_inspected == len(GRADIENTS)


def test_step_range(tmp_path):
    write_job(tmp_path, steps=10, bad_step=4)
    trial = create_trial(str(tmp_path))
    assert not invoke_rule(ExplodingTensor(trial), start_step=5).fired
    assert not invoke_rule(ExplodingTensor(trial), end_step=4).fired
    report = invoke_rule(ExplodingTensor(trial), start_step=2, end_step=6)
    assert report.fired_steps == [4] and (report.first_step, report.last_step) == (2, 5)


def test_raise_on_fire(tmp_path):
    write_job(tmp_path, steps=10, bad_step=4)
    with pytest.raises(RuleEvaluationConditionMet) as caught:
        invoke_rule(ExplodingTensor(create_trial(str(tmp_path))), raise_on_fire=True)
    assert caught.value.step == 4 and caught.value.rule == "ExplodingTensor"


class Broken(Rule):
    def invoke_at_step(self, step: int) -> bool:
        raise ZeroDivisionError("oops")


def test_a_broken_rule_is_reported_and_the_others_run(tmp_path):
    write_job(tmp_path, steps=10, bad_step=4)
    trial = create_trial(str(tmp_path))
    broken, exploding = run_rules([Broken(trial), ExplodingTensor(trial)])
    assert broken.status == "error" and "ZeroDivisionError: oops" in broken.errors[0]
    assert exploding.fired


def test_unknown_parameter_names_the_valid_ones(tmp_path):
    write_job(tmp_path, steps=1)
    from stepscope.exceptions import ConfigError

    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) 'treshold'; valid: threshold"):
        VanishingGradient(create_trial(str(tmp_path)), treshold=1)
    with pytest.raises(ConfigError, match="VanishingGradient.threshold must be float, got 'abc'"):
        VanishingGradient(create_trial(str(tmp_path)), threshold="abc")


def test_watch_follows_a_running_job_without_busy_looping(tmp_path):
    writer = write_job(tmp_path, steps=0, close=False)
    trial = create_trial(str(tmp_path))
    refreshes = []
    original = trial.refresh

    def counting_refresh():
        refreshes.append(time.monotonic())
        return original()

    trial.refresh = counting_refresh

    def produce():
        for step in range(6):
            time.sleep(0.2)
            writer.write_step(step, ModeKeys.TRAIN, step, {name: np.full((2, 2), 0.5 if step != 3 else np.inf, np.float32) for name in GRADIENTS})
            writer.flush()
        time.sleep(0.3)
        writer.close()

    thread = threading.Thread(target=produce)
    thread.start()
    started = time.monotonic()
    report = invoke_rule(ExplodingTensor(trial), watch=True, poll_interval=0.02, max_poll_interval=0.2, timeout=30)
    thread.join()
    assert report.steps_evaluated == 6 and report.fired_steps == [3]
    elapsed = time.monotonic() - started
    # Backoff: about elapsed / max_poll_interval looks, never a tight loop.
    assert len(refreshes) < elapsed / 0.02, (len(refreshes), elapsed)


def test_watch_timeout(tmp_path):
    write_job(tmp_path, steps=2, close=False)
    started = time.monotonic()
    report = invoke_rule(ExplodingTensor(create_trial(str(tmp_path))), watch=True, timeout=0.5, poll_interval=0.05)
    assert report.steps_evaluated == 2
    assert 0.4 < time.monotonic() - started < 5
