"""HookBase, the contract every plugin builds on: schedules, planning, saving, options,
the fail-safe, stop requests, driven here by hand (see test_numpy_plugin.py for a whole
plugin built on it)."""

import time

import numpy as np
import pytest

from stepscope import ModeKeys, create_trial
from stepscope.capture.control import request_stop
from stepscope.capture.hook import HookBase
from stepscope.config import Collection, ProfilerConfig, ReductionConfig, SaveConfig, SaveConfigMode
from stepscope.exceptions import ConfigError, TensorUnavailableForStep

REGEXES = {"weights": [r"^(?!gradient).*weight"], "gradients": ["^gradient"], "losses": ["loss"]}


class BareHook(HookBase):
    framework = "test"
    builtin_regexes = REGEXES


def make_core(out_dir, **kwargs):
    kwargs.setdefault("profiler_config", ProfilerConfig.disabled())
    return BareHook(str(out_dir), **kwargs)


def test_due_collections_follow_each_schedule(tmp_path):
    weights_every_3 = Collection("weights", save_config=SaveConfig(save_interval=3, save_steps=[4]))
    core = make_core(
        tmp_path,
        include_collections=["gradients"],
        collections=[weights_every_3],
        save_config=SaveConfig(save_interval=5, mode_save_configs={ModeKeys.EVAL: SaveConfigMode(save_interval=2)}),
    )
    for mode, count in ((ModeKeys.TRAIN, 40), (ModeKeys.EVAL, 12), (ModeKeys.TRAIN, 10)):
        for _ in range(count):
            mode_step = core.mode_step(mode)
            core.begin_step(mode)
            expected = set()
            interval = 2 if mode == ModeKeys.EVAL else 5  # the EVAL override replaces the default
            if mode_step % interval == 0:
                expected |= {"losses", "metrics", "default"}  # always included
                if mode == ModeKeys.TRAIN:
                    expected.add("gradients")  # gradients are never due outside TRAIN
            if mode_step % 3 == 0 or mode_step == 4:  # the collection's own schedule, every mode
                expected.add("weights")
            assert {c.name for c in core.current_step.due} == expected, (mode, mode_step)
            core.end_step()
    assert core.global_step == 62
    core.close()


def test_plan_merges_collections_and_save_numpy_reduces_with_numpy(tmp_path):
    core = make_core(
        tmp_path,
        include_collections=["weights"],
        collections=[Collection("stats", include_regex="^fc", reduction_config=ReductionConfig(norms=["l2"], abs_reductions=["max"], save_shape=True))],
        save_config=SaveConfig(save_interval=1),
    )
    core.begin_step(ModeKeys.TRAIN)
    plan = core.plan("fc.weight")
    assert plan.save_raw and plan.save_shape and plan.reductions == (("max", True), ("l2", False))
    assert core.plan("gradient/fc.weight") is None  # gradients not included
    value = np.array([[3.0, -4.0]], dtype=np.float32)
    core.save_value("fc.weight", value)
    core.save_value("loss", np.float32(0.5), collections=["losses"])
    core.close()
    trial = create_trial(str(tmp_path))
    w = trial.tensor("fc.weight")
    np.testing.assert_array_equal(w.value(0), value)
    assert w.reduction_value(0, "l2") == pytest.approx(5.0) and w.reduction_value(0, "max", abs=True) == 4.0
    assert trial.tensor("smdebug/reductions/l2/fc.weight").value(0) == pytest.approx(5.0)
    assert trial.tensor("loss").value(0) == 0.5
    assert trial.collection("stats").tensor_names == {"fc.weight"}


def test_losses_and_metrics_stay_whole_under_a_hook_s_reduction_config(tmp_path, caplog):
    # As smdebug keeps its scalar collections raw: a hook asked for norms of everything
    # still saves the loss and the metrics themselves (what the loss rules read), and a
    # reduction_config given to the losses collection itself is refused with a warning.
    core = make_core(
        tmp_path,
        include_collections=["weights"],
        collections=[Collection("losses", reduction_config=ReductionConfig(norms=["l1"]))],
        reduction_config=ReductionConfig(norms=["l2"]),
        save_config=SaveConfig(save_interval=1),
    )
    assert "'losses' keeps its values whole" in caplog.text
    core.begin_step(ModeKeys.TRAIN)
    weight = np.array([[3.0, -4.0]], dtype=np.float32)
    core.save_value("fc.weight", weight)
    core.save_value("loss", np.float32(0.25), collections=["losses"])
    core.save_value("accuracy", np.float32(0.75), collections=["metrics"])
    core.close()
    trial = create_trial(str(tmp_path))
    assert sorted(trial.tensor_names()) == ["accuracy", "fc.weight", "loss", "smdebug/reductions/l2/fc.weight"]
    assert trial.tensor("loss").value(0) == 0.25 and trial.tensor("accuracy").value(0) == 0.75
    assert trial.tensor("smdebug/reductions/l2/fc.weight").value(0) == pytest.approx(5.0)
    # The weight, saved as its norm only, is a tensor of the trial as in smdebug's reader.
    weight = trial.tensor("fc.weight")
    assert weight.steps() == [0] and not weight.has_value(0) and weight.reduction_value(0, "l2") == pytest.approx(5.0)
    with pytest.raises(TensorUnavailableForStep):
        weight.value(0)


def test_bad_arguments_fail_at_construction(tmp_path):
    with pytest.raises(ConfigError, match="unknown collection.*'activations'"):
        make_core(tmp_path, include_collections=["activations"])
    with pytest.raises(ConfigError, match="include_regex.*bad regular expression"):
        make_core(tmp_path, include_regex="([")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        make_core(tmp_path / "file")
    with pytest.raises(ConfigError, match="include_workers"):
        make_core(tmp_path, include_workers="some")


def test_disabled_by_env_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_DISABLE", "1")
    core = make_core(tmp_path / "job", save_config=SaveConfig(save_interval=1))
    assert not core.enabled and core.writer is None
    core.begin_step(ModeKeys.TRAIN)
    core.save_value("loss", 1.0, ["losses"])
    core.close()
    assert not (tmp_path / "job").exists()


def test_only_rank_zero_saves_with_include_workers_one(tmp_path):
    other = make_core(tmp_path, rank=1, world_size=2)
    assert not other.writes_tensors and not other.begin_step(ModeKeys.TRAIN)
    other.close()
    every = make_core(tmp_path / "all", rank=1, world_size=2, include_workers="all")
    assert every.writes_tensors and every.worker == "worker_1" and every.num_workers == 2
    every.close()


def _rule_that_stopped(core, seconds: float = 5.0) -> str | None:
    """Waits for the hook's poller to see a stop request: the requesting rule (None: none came)."""
    deadline = time.monotonic() + seconds
    while not core.stop_requested and time.monotonic() < deadline:
        time.sleep(0.01)
    return core.stop_poller.request["rule"] if core.stop_requested else None


def test_stop_request_is_seen_by_the_poller(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_STOP_POLL_S", "0.05")
    core = make_core(tmp_path)
    assert not core.stop_requested
    request_stop(core.store, "ExplodingTensor", "NaN in gradients")
    assert _rule_that_stopped(core) == "ExplodingTensor"
    core.close()


def test_an_earlier_runs_stop_request_does_not_stop_a_new_run(tmp_path, monkeypatch):
    """A rule (or a black box) stopped the last run in this folder; a new run there trains,
    and still stops on a request made during it."""
    monkeypatch.setenv("STEPSCOPE_STOP_POLL_S", "0.05")
    first = make_core(tmp_path)
    request_stop(first.store, "ExplodingTensor", "NaN in gradients")
    first.close()
    core = make_core(tmp_path)
    time.sleep(0.3)  # several polls
    assert not core.stop_requested
    time.sleep(0.01)  # a later time stamp: a new request differs from the old one's bytes
    request_stop(core.store, "LossNotDecreasing", "flat")
    assert _rule_that_stopped(core) == "LossNotDecreasing"
    core.close()


def test_a_hook_left_open_is_closed_at_interpreter_exit(tmp_path):
    # The job ends with the process: what was saved is published and the end marker is
    # written, as close() would (the writer's own exit handler must not close it first).
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        from stepscope.config import ProfilerConfig, SaveConfig
        from stepscope.capture.hook import HookBase

        class BareHook(HookBase):
            framework = "test"

        hook = BareHook({str(tmp_path / "job")!r}, save_config=SaveConfig(save_interval=1), profiler_config=ProfilerConfig.disabled())
        for step in range(3):
            hook.begin_step()
            hook.save_scalar("accuracy", 0.5 + step / 10)
            hook.end_step()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert (tmp_path / "job" / "training_job_end.ts").exists()
    trial = create_trial(str(tmp_path / "job"))
    assert trial.is_complete()
    assert [float(trial.tensor("accuracy").value(s)) for s in trial.steps()] == pytest.approx([0.5, 0.6, 0.7])


def test_a_hand_driven_step_is_data_until_begin_step_then_other(tmp_path):
    # The wait for the batch comes before begin_step; the step's own work after it is not
    # "data" (a custom loop that marks no phases once showed 100 % data: a false data-loader
    # bottleneck).
    from stepscope.profiler import create_profiler_trial

    hook = make_core(tmp_path / "job", profiler_config=ProfilerConfig(system_monitor=False))
    for _ in range(4):
        time.sleep(0.02)  # fetching the batch
        with hook.step("train"):
            time.sleep(0.05)  # the step's work, no phase marked
    hook.begin_step("eval", phase="compute")  # a plugin that knows the work is compute
    time.sleep(0.03)
    hook.end_step()
    hook.close()
    timeline = create_profiler_trial(str(tmp_path / "job")).step_timeline()
    train = timeline[(timeline["mode"] == "TRAIN") & (timeline["step"] > 0)]  # (step 0 waited for nothing)
    per_phase = train.groupby("phase")["duration_ms"].median()
    assert set(per_phase.index) == {"data", "other", "step"}
    assert 15 <= per_phase["data"] < 45 and 45 <= per_phase["other"] < 90, per_phase
    evaluation = timeline[timeline["mode"] == "EVAL"].set_index("phase")["duration_ms"]
    assert evaluation["compute"] >= 25 and "other" not in evaluation.index
    with pytest.raises(ConfigError, match="unknown phase 'fetch'"):
        hook.begin_step("train", phase="fetch")


def test_steps_held_before_a_failure_are_written_at_close(tmp_path, caplog):
    # Losses saved at every step are held and handed to the writer a hundred steps at a
    # time (held_steps.py): a failure that turns the hook off must not drop those already
    # saved. The fail-safe's failure here is planted where a plugin's would come from.
    hook = make_core(tmp_path / "job")  # (the capture defaults: losses at every step)
    for step in range(30):
        hook.begin_step("train")
        hook.save_loss(float(step) / 7)
        hook.end_step()
    assert len(hook._runtime.held) == 30  # none written yet
    hook.failsafe.fail(RuntimeError("planted plugin failure"))
    assert not hook.enabled
    hook.close()
    loss = create_trial(str(tmp_path / "job")).tensor("loss")
    assert loss.steps() == list(range(30))
    assert [float(loss.value(s)) for s in range(30)] == [s / 7 for s in range(30)]
