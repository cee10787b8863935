"""A whole plugin on `HookBase` alone: a training loop in plain numpy (linear regression,
SGD). It supplies only tensor discovery (its parameters), capture to host (a copy) and its
events (the loop's phases); the public surface is core's. What it saves must equal what
numpy computed, and its step timeline must account for every step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stepscope import ModeKeys, create_trial
from stepscope.capture.hook import HookBase, StopTrainingRequested, TensorPlan
from stepscope.capture.hook_options import HookOptions
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.exceptions import ConfigError


class NumpyHook(HookBase):
    """stepscope for a numpy loop: `register_parameters({"w": w, "b": b})`, then
    `begin_step` / `phase(...)` / `save_gradients` / `end_step`."""

    framework = "numpy"
    builtin_regexes = {"weights": [r"^w"], "biases": [r"^b"], "gradients": [r"^gradient/"], "losses": [r"loss"]}

    def __init__(self, *args: Any, **kwargs: Any):
        self._params: dict[str, np.ndarray] = {}
        super().__init__(*args, **kwargs)

    def register_parameters(self, params: dict[str, np.ndarray]) -> None:
        self._params = dict(params)
        self.claim_names(params)
        self.claim_names(f"gradient/{n}" for n in params)

    def _capture(self, plan: TensorPlan, value: Any) -> bool:
        if not isinstance(value, np.ndarray):
            return False
        self._record_host(plan, value.copy())  # the loop updates its arrays in place
        return True

    def _on_step_begin(self, due: bool) -> None:
        if due:
            for name, value in self._params.items():
                self.save_value(name, value)

    def save_gradients(self, grads: dict[str, np.ndarray]) -> None:
        if self.due:
            for name, grad in grads.items():
                self.save_value(f"gradient/{name}", grad, ("gradients",))


def train(hook: NumpyHook, steps: int, seed: int = 0) -> list[dict[str, Any]]:
    """Linear regression by SGD; returns what numpy computed at each step."""
    rng = np.random.default_rng(seed)
    w, b = rng.normal(size=(3,)).astype(np.float32), np.zeros(1, np.float32)
    hook.register_parameters({"w": w, "b": b})
    seen: list[dict[str, Any]] = []
    first = hook.global_step
    for _ in range(steps):
        x = rng.normal(size=(16, 3)).astype(np.float32)
        y = x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3
        hook.begin_step(ModeKeys.TRAIN)
        assert hook.global_step == first + len(seen) or not hook.enabled  # inside step k, global_step is k
        record = {"w": w.copy(), "b": b.copy()}
        with hook.phase("forward"):
            err = x @ w + b - y
            loss = np.float32(np.mean(err**2))
        with hook.phase("backward"):
            grads = {"w": (2 * x.T @ err / len(x)).astype(np.float32), "b": np.array([2 * err.mean()], np.float32)}
        hook.save_gradients(grads)
        hook.save_loss(loss)
        with hook.phase("optimizer"):
            w -= 0.1 * grads["w"]
            b -= 0.1 * grads["b"]
        hook.end_step()
        seen.append({**record, "grads": grads, "loss": loss})
    return seen


def test_a_numpy_plugin_saves_what_numpy_computed(tmp_path):
    out = str(tmp_path / "job")
    with NumpyHook(out, SaveConfig(save_interval=3), include_collections=["weights", "biases", "gradients"],
                   profiler_config=ProfilerConfig(system_monitor=False)) as hook:
        seen = train(hook, 8)
        assert hook.global_step == 8  # between steps: the next step's number
    trial = create_trial(out)
    assert trial.steps() == [0, 3, 6]
    for step in (0, 3, 6):
        np.testing.assert_array_equal(trial.tensor("w").value(step), seen[step]["w"])
        np.testing.assert_array_equal(trial.tensor("b").value(step), seen[step]["b"])
        np.testing.assert_array_equal(trial.tensor("gradient/w").value(step), seen[step]["grads"]["w"])
        assert float(trial.tensor("loss").value(step)) == pytest.approx(float(seen[step]["loss"]))
    assert trial.collection("gradients").tensor_names == {"gradient/w", "gradient/b"}


def test_the_numpy_plugins_timeline_accounts_for_every_step(tmp_path):
    from stepscope.profiler import STEP_PHASES, create_profiler_trial

    out = str(tmp_path / "job")
    with NumpyHook(out, profiler_config=ProfilerConfig(system_monitor=False)) as hook:
        train(hook, 5)
    timeline = create_profiler_trial(out).step_timeline()
    assert set(timeline["framework"]) == {"numpy"}
    steps = timeline[timeline["phase"].isin(STEP_PHASES)]
    assert sorted(steps["step"]) == [0, 1, 2, 3, 4]
    parts = timeline[~timeline["phase"].isin(STEP_PHASES)]
    for step, whole in steps.groupby("step"):
        mine = parts[parts["step"] == step]
        # The wait before begin_step is "data"; from there, time outside the phase blocks is "other".
        assert list(mine.sort_values(["start_ns", "end_ns"])["phase"]) == ["data", "other", "forward", "other", "backward", "other", "optimizer", "other"]
        covered = int((mine["end_ns"] - mine["start_ns"]).sum())
        assert covered >= 0.95 * int(whole["end_ns"].iloc[0] - whole["start_ns"].iloc[0])


def test_user_values_are_checked_at_the_call(tmp_path):
    hook = NumpyHook(str(tmp_path / "job"), SaveConfig(save_interval=1), profiler_config=ProfilerConfig.disabled())
    hook.register_parameters({"w": np.zeros(2, np.float32)})
    hook.begin_step()
    with pytest.raises(ConfigError, match=r"save_tensor\('mixed'\).*dtype object"):
        hook.save_tensor("mixed", [{"a": 1}, None])
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        hook.save_tensor("bad\udc80name", 1.0)
    with pytest.raises(ConfigError, match=r"save_tensor\('w'\): the model has a tensor of that name"):
        hook.save_tensor("w", np.ones(2))
    with pytest.raises(ConfigError, match="non-empty string"):
        hook.save_tensor("", 1.0)
    hook.save_tensor("mine", np.arange(3), collections="metrics")  # a string is one collection
    hook.save_scalar("acc", 0.5)
    hook.end_step()
    hook.close()
    assert hook.failsafe.error is None  # user mistakes are the user's, never the writer thread's
    trial = create_trial(str(tmp_path / "job"))
    assert trial.collection("metrics").tensor_names == {"mine", "acc"}
    np.testing.assert_array_equal(trial.tensor("mine").value(0), np.arange(3))


def test_options_in_one_frozen_value(tmp_path):
    options = HookOptions(str(tmp_path), include_collections="weights", include_regex="fc1")
    assert options.include_collections == ("weights",) and options.include_regex == ("fc1",)
    with pytest.raises(AttributeError):
        options.save_all = True  # type: ignore[misc]
    hook = NumpyHook(options, profiler_config=ProfilerConfig.disabled())  # keywords replace fields
    assert hook.options.include_collections == ("weights",) and hook.options.profiler_config == ProfilerConfig.disabled()
    hook.close()
    positional = HookOptions.of(str(tmp_path), SaveConfig(save_interval=7), None, ["weights"])
    assert positional.save_config == SaveConfig(save_interval=7) and positional.include_collections == ("weights",)
    for kwargs, field in [
        ({"include_collections": [1]}, "include_collections"),
        ({"include_workers": "some"}, "include_workers"),
        ({"save_config": {"save_interval": 3}}, "save_config"),
        ({"collections": ["weights"]}, "collections"),
        ({"save_all": "maybe"}, "save_all"),
        ({"savee_all": True}, "savee_all"),
    ]:
        with pytest.raises(ConfigError, match=field):
            HookOptions.of(str(tmp_path), **kwargs)
    with pytest.raises(ConfigError, match="out_dir"):
        HookOptions("")


def test_step_counters_resume_from_a_state(tmp_path):
    first = NumpyHook(str(tmp_path / "a"), profiler_config=ProfilerConfig.disabled())
    for mode in ("train", "train", "eval", "train"):
        first.begin_step(mode)
        first.end_step()
    state = first.state_dict()
    first.close()
    second = NumpyHook(str(tmp_path / "b"), profiler_config=ProfilerConfig.disabled())
    second.load_state_dict(state)
    second.begin_step("train")
    assert second.global_step == 4 and second.current_step.mode_step == 3
    with pytest.raises(ConfigError, match="load_state_dict"):
        second.load_state_dict({"mode_steps": {}})
    second.close()


def test_stop_request_raises_once_at_the_end_of_a_train_step(tmp_path):
    from stepscope.capture.control import request_stop

    hook = NumpyHook(str(tmp_path), profiler_config=ProfilerConfig.disabled())
    request_stop(hook.store, "TestRule", "enough")
    hook.stop_poller.check_now()
    hook.begin_step("eval")
    hook.end_step()  # not a TRAIN step: no exception
    with pytest.raises(StopTrainingRequested, match="TestRule"):
        with hook.step("train"):
            pass
    hook.begin_step("train")
    hook.end_step()  # once only
    hook.close()


class BrokenHook(NumpyHook):
    def _capture(self, plan, value):
        raise RuntimeError("disk on fire")


def test_a_hook_that_switched_itself_off_is_visible(tmp_path, capsys):
    from stepscope.cli import main
    from stepscope.trial import Trial

    out = str(tmp_path / "job")
    hook = BrokenHook(out, SaveConfig(save_interval=1), include_collections="weights", profiler_config=ProfilerConfig.disabled())
    train(hook, 3)  # training goes on
    assert not hook.enabled and "disk on fire" in str(hook.failsafe.error)
    hook.close()
    [(worker, cause)] = Trial.failed_workers_in(hook.store).items()
    assert worker == "worker_0" and cause == "numpy hook: RuntimeError: disk on fire"
    assert Trial.status_in(hook.store)["worker_0"]["state"] == "failed"
    assert main(["check", out, "--quiet", "--no-write"]) == 2
    err = capsys.readouterr().err
    assert "the hook of worker_0 failed" in err and "disk on fire" in err and "no saved data" not in err


def test_cli_version_and_whole_rule_descriptions(capsys):
    import stepscope
    from stepscope.cli import main

    assert main(["--version"]) == 0
    first, second = capsys.readouterr().out.strip().splitlines()
    assert first == f"stepscope {stepscope.__version__}"
    from stepscope import compiled

    # The second line names what runs compiled; each name is one the extension table knows.
    assert second == compiled.describe() and (second.startswith("compiled: ") or second.startswith("Python paths only"))
    for what, on in compiled.loaded().items():
        assert (what in second.split(";")[0]) == on
    from stepscope.rules.registry import describe_rules

    assert main(["rules"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for rule in describe_rules():
        assert " ".join(str(rule["explanation"]["definition"]).split()) in text  # whole, never cut


def test_one_timeline_per_worker_however_many_files(tmp_path):
    """Flushed after every stage into many files, by two workers: the reader gives one
    stream per worker and `stepscope timeline` one Chrome trace with every step."""
    import json
    from decimal import Decimal

    from stepscope.cli import main
    from stepscope.profiler import create_profiler_trial

    out = str(tmp_path / "job")
    for rank in (0, 1):
        hook = NumpyHook(out, include_workers="all", rank=rank, world_size=2, profiler_config=ProfilerConfig(system_monitor=False))
        for _ in range(3):
            train(hook, 2, seed=rank)
            hook.flush()  # a stage ends: one more file
        hook.close()
    timeline = create_profiler_trial(out).step_timeline()
    steps = timeline[timeline["phase"] == "step"]
    assert {rank: sorted(s["step"]) for rank, s in steps.groupby("rank")} == {0: list(range(6)), 1: list(range(6))}
    merged = tmp_path / "merged.json"
    assert main(["timeline", out, "-o", str(merged)]) == 0
    trace = json.loads(merged.read_text(), parse_float=Decimal)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(timeline)
    assert sorted((e["pid"], e["args"]["step"]) for e in spans if e["name"] == "step") == [(r, s) for r in (0, 1) for s in range(6)]
