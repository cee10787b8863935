"""The compiled hot path (fastpath.py, _fastpath.c) against the Python one: the same job,
the same state, the same timeline, from the same training; and what it does on failure."""

from __future__ import annotations

import gc
import os
import time
import weakref

import numpy as np
import pytest
import torch
from torch import nn

import stepscope
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.modes import ModeKeys
from stepscope_torch import Hook, fastpath

COMPILED = fastpath.compiled() is not None
needs_compiled = pytest.mark.skipif(not COMPILED, reason="the _fastpath extension is not built here")
TIMELINE_ONLY = ProfilerConfig(system_monitor=False)


def test_the_extension_is_built_where_it_is_expected():
    # CI (nox) builds the packages with a C compiler and sets this: a build that silently
    # fell back to Python would otherwise pass every other test here.
    if os.environ.get("STEPSCOPE_EXPECT_COMPILED") == "1":
        assert COMPILED, "stepscope_torch._fastpath was not built (no C compiler when the package was installed?)"


def make_hook(out_dir, compiled: bool, **options) -> Hook:
    os.environ.pop(fastpath.PURE_PYTHON_ENV, None)
    if not compiled:
        os.environ[fastpath.PURE_PYTHON_ENV] = "1"
    try:
        hook = Hook(str(out_dir), **options)
    finally:
        os.environ.pop(fastpath.PURE_PYTHON_ENV, None)
    assert (hook._fast is not None) == compiled
    return hook


class ObjectClock:
    """A clock whose tokens are objects (as a GPU's events are): the log is a deque of
    tuples, and the compiled path takes its generic way (a Python call per reading)."""

    immediate = True
    int_tokens = False

    class Token:
        __slots__ = ("ns",)

        def __init__(self, ns: int) -> None:
            self.ns = ns

    def __init__(self) -> None:
        self.offset = time.time_ns() - time.perf_counter_ns()

    def now(self) -> Token:
        return self.Token(time.perf_counter_ns())

    def ready(self, token: Token) -> bool:
        return True

    def wait(self, token: Token) -> None:
        return None

    def to_wall_ns(self, token: Token) -> int:
        return token.ns + self.offset


def train_through_every_case(hook: Hook, mlp, batches, with_optimizer: bool = True, clock=None) -> dict:
    """A loop that takes every branch of the hot path: plain steps, micro-batches, a step
    that saves and the one after it, evaluation and prediction steps, set_mode, an optimizer
    step without a forward, and state_dict. Returns what the hook says of itself."""
    model, loss_fn = mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook.register_module(model)
    if clock is not None:
        hook._set_clock(clock)  # (after register_module, which sets the device's clock)
    hook.register_loss(loss_fn)
    if with_optimizer:
        hook.register_optimizer(optimizer)
    seen = []
    data = batches(12)
    for i in range(40):
        micro = 2 if i % 7 == 3 and with_optimizer else 1  # gradient accumulation
        optimizer.zero_grad()
        for j in range(micro):
            x, y = data[(i + j) % len(data)]
            loss_fn(model(x), y).backward()
        optimizer.step()
        seen.append((hook.global_step, hook.mode))
        if i == 20:
            model.eval()
            with torch.no_grad():
                for x, _ in data[:3]:
                    model(x)
                    seen.append((hook.global_step, hook.mode))
                hook.set_mode("predict")
                model(data[0][0])
                model(data[1][0])
                seen.append((hook.global_step, hook.mode))
                hook.set_mode(None)
            model.train()
        if i == 25:
            with torch.no_grad():  # a forward without autograd in training mode: an EVAL step
                model(data[2][0])
            seen.append((hook.global_step, hook.mode))
        if i == 30 and with_optimizer:
            optimizer.step()  # without a forward: a step of its own
            seen.append((hook.global_step, hook.mode))
    return {
        "seen": seen, "state": hook.state_dict(), "global_step": hook.global_step,
        "mode_steps": {m.name: hook.mode_step(m) for m in ModeKeys}, "weights": [p.detach().clone() for p in model.parameters()],
    }


def job_summary(out_dir) -> dict:
    trial = stepscope.create_trial(str(out_dir))
    steps = {mode: trial.steps(mode=mode) for mode in ("train", "eval", "predict")}
    tensors = {
        name: [trial.tensor(name).value(step, mode="train") for step in trial.tensor(name).steps(mode="train")]
        for name in trial.tensor_names()
    }
    timeline = trial.profiler.step_timeline()
    # Times differ between two runs; which phases each step has, in which order, does not.
    phases = [(row.mode, int(row.step), row.phase) for row in timeline.sort_values(["step", "start_ns"]).itertuples()]
    return {"steps": steps, "tensors": tensors, "phases": phases, "status": trial.status()}


@needs_compiled
@pytest.mark.parametrize(
    ("with_optimizer", "clock"), [(True, None), (False, None), (True, ObjectClock)], ids=["optimizer-driven", "forward-driven", "object-tokens"]
)
def test_compiled_and_python_paths_write_the_same_job(tmp_path, mlp, batches, with_optimizer, clock):
    results, jobs = {}, {}
    for compiled in (True, False):
        out = tmp_path / ("compiled" if compiled else "python")
        hook = make_hook(
            out, compiled, profiler_config=TIMELINE_ONLY, save_config=SaveConfig(save_interval=6),
            include_collections=["weights", "gradients", "losses"],
        )
        results[compiled] = train_through_every_case(hook, mlp, batches, with_optimizer, clock and clock())
        if compiled:
            counters = hook._counters
            # It did most calls itself, and handed the steps that save to Python.
            assert counters.routine > counters.handed_over > 0
        hook.close()
        jobs[compiled] = job_summary(out)
    fast, slow = results[True], results[False]
    assert fast["seen"] == slow["seen"]
    assert fast["state"] == slow["state"] and fast["mode_steps"] == slow["mode_steps"] and fast["global_step"] == slow["global_step"]
    for a, b in zip(fast["weights"], slow["weights"]):
        assert torch.equal(a, b)
    assert jobs[True]["steps"] == jobs[False]["steps"] and jobs[True]["steps"]["eval"] and jobs[True]["steps"]["predict"]
    assert jobs[True]["tensors"].keys() == jobs[False]["tensors"].keys()
    for name, values in jobs[True]["tensors"].items():
        assert all(np.array_equal(a, b) for a, b in zip(values, jobs[False]["tensors"][name], strict=True)), name
    assert jobs[True]["phases"] == jobs[False]["phases"]
    # Every step of every mode is on the timeline, in whole.
    assert {step for _, step, phase in jobs[True]["phases"] if phase.endswith("step")} == set(range(fast["global_step"] + 1))
    # No failure; a job this short is only told it saved too little for the loss rules.
    assert jobs[True]["status"] == jobs[False]["status"] and {s["state"] for s in jobs[True]["status"].values()} <= {"too little data"}


@pytest.mark.parametrize("compiled", [pytest.param(True, marks=needs_compiled), False], ids=["compiled", "python"])
def test_a_failing_clock_turns_the_timeline_off_and_training_goes_on(tmp_path, mlp, batches, compiled):
    hook = make_hook(tmp_path / "job", compiled, profiler_config=TIMELINE_ONLY, save_config=SaveConfig(save_interval=4), include_collections=["weights"])
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    data = batches(10)
    calls = []

    def broken_clock() -> int:
        calls.append(1)
        if len(calls) > 12:
            raise RuntimeError("clock gone")
        return len(calls)

    hook._counters.now = broken_clock
    for x, y in data:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    assert hook.enabled and not hook.profiler_failsafe.enabled  # tensors go on, the timeline stopped
    assert len(calls) == 13  # no reading after the failure
    hook.close()
    trial = stepscope.create_trial(str(tmp_path / "job"))
    assert trial.steps(mode="train") == [0, 4, 8]
    assert trial.status()["worker_0_profiler"]["error"].endswith("clock gone")


@pytest.mark.parametrize("compiled", [pytest.param(True, marks=needs_compiled), False], ids=["compiled", "python"])
def test_hook_model_and_optimizer_are_freed_after_close(tmp_path, mlp, batches, compiled):
    # The driven class, the optimizer's hooks and the counters hold the hook: a cycle the
    # garbage collector must be able to follow (tp_traverse) once the user lets go.
    hook = make_hook(tmp_path / "job", compiled, profiler_config=TIMELINE_ONLY)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    x, y = batches(1)[0]
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    refs = [weakref.ref(hook), weakref.ref(model), weakref.ref(optimizer)]
    hook.close()
    del hook, model, optimizer
    # (The hook's background threads hold it until they have seen the close and ended.)
    deadline = time.monotonic() + 10
    while any(ref() is not None for ref in refs) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert [ref() for ref in refs] == [None, None, None]


@needs_compiled
def test_the_compiled_counters_are_the_state_python_reads(tmp_path, mlp, batches):
    # Python and C share one state: what the compiled path counts, the hook's methods and
    # the idle step read, and what Python sets, the compiled path obeys.
    # smdebug's every-500-steps schedule: step 5 is idle (by default losses are due every step).
    hook = make_hook(tmp_path / "job", True, profiler_config=TIMELINE_ONLY, save_config=SaveConfig())
    counters = hook._counters
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    x, y = batches(1)[0]
    for _ in range(5):
        model(x)
        optimizer.step()
    assert counters.global_step == 5 and hook.mode_step("train") == 5 and counters.begun[ModeKeys.TRAIN] == 5
    model(x)
    assert hook.current_step is counters.idle and hook.current_step.global_step == 5 and hook.current_step.mode_step == 5
    optimizer.step()
    assert counters.next_due[ModeKeys.TRAIN] is not None and counters.train_at == -1
    counters.next_due[ModeKeys.PREDICT] = None
    assert counters.next_due[ModeKeys.PREDICT] is None
    with pytest.raises(TypeError):
        counters.begun[ModeKeys.TRAIN] = None
    with pytest.raises(IndexError):
        counters.begun[7]
    hook.load_state_dict({"global_step": 100, "mode_steps": {"TRAIN": 90}})
    model(x)
    optimizer.step()
    assert hook.state_dict() == {"global_step": 101, "mode_steps": {"TRAIN": 91, "EVAL": 0, "PREDICT": 0, "GLOBAL": 0}}
    words = counters.log_words()
    words.extend((1, 2, 3))
    assert len(words) == 3 and words.take() == [1, 2, 3] and len(words) == 0
    with pytest.raises(TypeError):
        words.extend(("x",))
    hook.close()


def train_with_losses(hook: Hook, mlp, batches, with_optimizer: bool) -> dict:
    """A loop under the capture defaults (the loss due at every step, tensors on their
    schedule), through what a compiled scalar step hands back to Python: values the user
    saves into it, a loss module whose output it does not read (reduction="none"), a loss
    registered midway, a loss computed after the update, gradient accumulation, and
    evaluation epochs (a run of EVAL scalar steps)."""
    model, loss_fn, per_sample = mlp(), nn.CrossEntropyLoss(), nn.CrossEntropyLoss(reduction="none")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    if with_optimizer:
        hook.register_optimizer(optimizer)
    data = batches(12)
    losses = []
    for i in range(150):
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        for _ in range(2 if with_optimizer and i % 9 == 4 else 1):  # gradient accumulation
            output = model(x)
            loss = loss_fn(output, y)
            if 70 <= i < 76:  # (fewer than fastpath.MISSES steps: no back-off)
                per_sample(output.detach(), y)  # a vector: saved the general way
            loss.backward()
        losses.append(loss.item())
        if i % 13 == 5:
            hook.save_scalar("lr", 0.05)  # a value of the user's in the open step
        if i == 60:
            hook.register_loss(per_sample)
        optimizer.step()
        if i % 17 == 3:
            loss_fn(output.detach(), y)  # after the update: no step's (with an optimizer)
        if i % 50 == 49:
            model.eval()
            with torch.no_grad():
                for x, y in data[:4]:
                    loss_fn(model(x), y)
            model.train()
    return {"losses": losses, "state": hook.state_dict(), "weights": [p.detach().clone() for p in model.parameters()]}


def job_values(out_dir) -> dict:
    """Every saved value of every mode, and the timeline's phases."""
    trial = stepscope.create_trial(str(out_dir))
    values = {
        (name, mode): [(step, trial.tensor(name).value(step, mode=mode)) for step in trial.tensor(name).steps(mode=mode)]
        for name in trial.tensor_names()
        for mode in ("train", "eval")
    }
    timeline = trial.profiler.step_timeline()
    phases = [(row.mode, int(row.step), row.phase) for row in timeline.sort_values(["step", "start_ns"]).itertuples()]
    return {"values": values, "phases": phases, "status": trial.status()}


@needs_compiled
@pytest.mark.parametrize("with_optimizer", [True, False], ids=["optimizer-driven", "forward-driven"])
def test_compiled_scalar_steps_write_the_same_job(tmp_path, mlp, batches, with_optimizer):
    results, jobs, counts = {}, {}, {}
    for compiled in (True, False):
        out = tmp_path / ("compiled" if compiled else "python")
        hook = make_hook(out, compiled, profiler_config=TIMELINE_ONLY)  # the capture defaults
        results[compiled] = train_with_losses(hook, mlp, batches, with_optimizer)
        if compiled:
            counts = {"scalar": hook._counters.scalar_steps, "steps": hook.global_step}
        hook.close()
        jobs[compiled] = job_values(out)
    fast, slow = results[True], results[False]
    assert fast["losses"] == slow["losses"] and fast["state"] == slow["state"]
    for a, b in zip(fast["weights"], slow["weights"]):
        assert torch.equal(a, b)
    # Most steps ran compiled, the loop's special steps on the Python path.
    assert counts["scalar"] > counts["steps"] / 2
    assert jobs[True]["values"].keys() == jobs[False]["values"].keys()
    for key, saved in jobs[True]["values"].items():
        other = jobs[False]["values"][key]
        assert [s for s, _ in saved] == [s for s, _ in other], key
        assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(saved, other)), key
    loss = jobs[True]["values"][("CrossEntropyLoss_output_0", "train")]
    assert len(loss) == 150 and [float(v) for _, v in loss] == pytest.approx(fast["losses"], rel=1e-6)
    assert len(jobs[True]["values"][("CrossEntropyLoss_output_0", "eval")]) == 12
    assert len(jobs[True]["values"][("lr", "train")]) == len(range(5, 150, 13))
    assert jobs[True]["phases"] == jobs[False]["phases"]
    assert jobs[True]["status"] == jobs[False]["status"] == {}


@needs_compiled
def test_a_compiled_scalar_step_hands_over_in_order_with_the_python_ones(tmp_path, mlp, batches):
    # Steps the compiled path ended wait in its list until HeldSteps takes them: every
    # hand-over of the Python path, a release, flush and close take them first.
    hook = make_hook(tmp_path / "job", True, profiler_config=ProfilerConfig.disabled())
    model, loss_fn = mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(optimizer)
    x, y = batches(1)[0]
    for _ in range(35):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    counters = hook._counters
    assert counters.scalar_steps > 0 and hook.current_step is not counters.idle
    waiting = len(hook._runtime.held)  # (takes the compiled path's list)
    assert waiting and counters.take_held() == []
    hook.flush()
    assert len(hook._runtime.held) == 0
    trial = stepscope.create_trial(str(tmp_path / "job"))
    assert trial.tensor("CrossEntropyLoss_output_0").steps() == list(range(35))  # (flush ends the open step too)
    hook.close()


def train_functional(hook: Hook, mlp, batches, big: bool) -> list[float]:
    """A functional loss saved with save_loss at every step (pytorch/examples' style), and
    with `big` a value no held step holds (160 KB) saved at every step too."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    data, losses = batches(12), []
    for i in range(120):
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        hook.save_loss(loss)
        if big:
            hook.save_scalar("big", np.full(20_000, float(i)))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@needs_compiled
@pytest.mark.parametrize("big", [False, True], ids=["save_loss", "save_loss-and-a-large-value"])
def test_steps_that_save_a_functional_loss_run_compiled_and_others_back_off(tmp_path, mlp, batches, big):
    jobs, scalar_steps, tries = {}, 0, None
    for compiled in (True, False):
        out = tmp_path / ("compiled" if compiled else "python")
        hook = make_hook(out, compiled, profiler_config=ProfilerConfig.disabled())
        losses = train_functional(hook, mlp, batches, big)
        if compiled:
            scalar_steps, tries = hook._counters.scalar_steps, hook.__dict__.get("_scalar_tries")
        hook.close()
        jobs[compiled] = job_values(out)
    assert jobs[True]["values"].keys() == jobs[False]["values"].keys()
    for key, saved in jobs[True]["values"].items():
        assert [s for s, _ in saved] == [s for s, _ in jobs[False]["values"][key]], key
        assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(saved, jobs[False]["values"][key])), key
    assert [float(v) for _, v in jobs[True]["values"][("loss", "train")]] == pytest.approx(losses, rel=1e-6)
    if big:
        # A step armed compiled is handed back at its end: after MISSES tries in a row, none
        # is armed until BACK_OFF steps later (past this loop's end).
        assert scalar_steps == 0 and tries is not None
        assert tries[0] == -1 and 120 < tries[2] <= 120 + fastpath.MISSES + fastpath.BACK_OFF
        assert len(jobs[True]["values"][("big", "train")]) == 120
    else:
        assert scalar_steps > 60  # (the numpy values save_loss records are held as they are)
