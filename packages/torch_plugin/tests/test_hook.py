"""The plain-loop Hook: saved values against the model's own tensors, step semantics,
modes, naming, configuration errors, stop requests."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import stepscope
from stepscope import reductions
from stepscope.capture.control import request_stop
from stepscope.config import Collection, ReductionConfig, SaveConfig
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys
from stepscope_torch import Hook, StopTrainingRequested

pytestmark = pytest.mark.usefixtures("hot_path")  # every test on both hot paths (conftest.py)


def train(model, data, hook=None, *, accumulate=1, optimizer_cls=torch.optim.SGD, register_optimizer=True, lr=0.1):
    """A plain loop; returns what it saw at each optimizer step: parameters used (before the
    update), the accumulated gradients, and the losses."""
    loss_fn = nn.CrossEntropyLoss()
    optimizer = optimizer_cls([p for p in model.parameters() if p.requires_grad], lr=lr)
    if hook is not None:
        hook.register_module(model)
        hook.register_loss(loss_fn)
        if register_optimizer:
            hook.register_optimizer(optimizer)
    seen = []
    for i, (x, y) in enumerate(data):
        if i % accumulate == 0:
            optimizer.zero_grad()
            weights = {n: p.detach().clone() for n, p in model.named_parameters()}
            losses = []
        loss = loss_fn(model(x), y)
        losses.append(loss.item())
        (loss / accumulate).backward()
        if i % accumulate == accumulate - 1:
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            optimizer.step()
            state = {n: {k: v.clone() for k, v in optimizer.state[p].items()} for n, p in model.named_parameters() if p in optimizer.state}
            seen.append({"weights": weights, "grads": grads, "losses": losses, "state": state})
    return seen


def test_saved_weights_gradients_losses_equal_the_models_own(make_hook, mlp, batches, out_dir):
    hook = make_hook(save_config=SaveConfig(save_interval=2), include_collections=["weights", "biases", "gradients"])
    seen = train(mlp(), batches(5), hook)
    hook.close()

    trial = stepscope.create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 2, 4]
    assert set(trial.tensor_names()) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "CrossEntropyLoss_output_0"} | {
        f"gradient/{n}" for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    }
    for step in (0, 2, 4):
        for name, value in seen[step]["weights"].items():
            np.testing.assert_array_equal(trial.tensor(name).value(step, mode=ModeKeys.TRAIN), value.numpy())
        for name, value in seen[step]["grads"].items():
            np.testing.assert_array_equal(trial.tensor(f"gradient/{name}").value(step, mode=ModeKeys.TRAIN), value.numpy())
        assert trial.tensor("CrossEntropyLoss_output_0").value(step, mode=ModeKeys.TRAIN) == pytest.approx(seen[step]["losses"][-1], rel=1e-6)
    assert "gradient/fc1.weight" in trial.collection("gradients").tensor_names
    assert trial.is_complete()


def test_reductions_equal_numpy_of_the_models_tensors(make_hook, mlp, batches, out_dir):
    config = ReductionConfig(reductions=("min", "max", "mean", "std", "variance", "sum", "prod"), abs_reductions=("mean",), norms=("l1", "l2"), save_raw_tensor=True)
    hook = make_hook(save_config=SaveConfig(save_interval=3), reduction_config=config, include_collections=["weights", "gradients"])
    seen = train(mlp(), batches(4), hook)
    hook.close()

    trial = stepscope.create_trial(out_dir)
    for step in (0, 3):
        for name, value in [("fc1.weight", seen[step]["weights"]["fc1.weight"]), ("gradient/fc2.weight", seen[step]["grads"]["fc2.weight"])]:
            tensor = trial.tensor(name)
            np.testing.assert_array_equal(tensor.value(step), value.numpy())
            for reduction, is_abs in config.requested():
                expected = reductions.compute(value.numpy(), reduction, is_abs)
                assert tensor.reduction_value(step, reduction, abs=is_abs) == pytest.approx(float(expected), rel=1e-12), (name, reduction, is_abs)


def test_gradient_accumulation_one_step_per_optimizer_step(make_hook, mlp, batches, out_dir):
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"])
    seen = train(mlp(), batches(12), hook, accumulate=4)
    hook.close()

    trial = stepscope.create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2] == list(range(len(seen)))
    for step, expected in enumerate(seen):
        for name, grad in expected["grads"].items():
            np.testing.assert_allclose(trial.tensor(f"gradient/{name}").value(step, mode=ModeKeys.TRAIN), grad.numpy(), rtol=0, atol=0)
        np.testing.assert_array_equal(trial.tensor("fc2.weight").value(step, mode=ModeKeys.TRAIN), expected["weights"]["fc2.weight"].numpy())
        # The loss saved is the last micro-batch's.
        assert trial.tensor("CrossEntropyLoss_output_0").value(step, mode=ModeKeys.TRAIN) == pytest.approx(expected["losses"][-1], rel=1e-6)


def test_optimizer_variables_are_the_state_after_the_update(make_hook, mlp, batches, out_dir):
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["optimizer_variables"])
    seen = train(mlp(), batches(3), hook, optimizer_cls=torch.optim.Adam, lr=0.01)
    hook.close()

    trial = stepscope.create_trial(out_dir)
    assert "optimizer/fc1.weight/exp_avg" in trial.tensor_names(collection="optimizer_variables")
    assert not trial.tensor_names(collection="weights")  # optimizer state never counts as weights
    for step in range(3):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            np.testing.assert_array_equal(trial.tensor(f"optimizer/fc2.bias/{key}").value(step), seen[step]["state"]["fc2.bias"][key].numpy())


def test_eval_and_predict_steps_count_top_level_forwards(make_hook, mlp, batches, out_dir):
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["weights"])
    model = mlp()
    seen = train(model, batches(2), hook)
    model.eval()
    with torch.no_grad():
        eval_losses = [nn.functional.cross_entropy(model(x), y).item() for x, y in batches(3, seed=7)]
        hook.set_mode("predict")
        for x, _ in batches(2, seed=8):
            model(x)
    hook.set_mode(None)
    model.train()
    train_more = batches(1, seed=9)
    loss_fn_out = model(train_more[0][0])  # a TRAIN forward (the hook's loss module is not called here)
    del loss_fn_out
    hook.close()

    trial = stepscope.create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2]
    assert trial.steps(mode=ModeKeys.EVAL) == [0, 1, 2]
    assert trial.steps(mode=ModeKeys.PREDICT) == [0, 1]
    # Global steps count every mode, in order.
    assert [trial.mode_of(s) for s in trial.steps()] == [
        (ModeKeys.TRAIN, 0), (ModeKeys.TRAIN, 1), (ModeKeys.EVAL, 0), (ModeKeys.EVAL, 1), (ModeKeys.EVAL, 2),
        (ModeKeys.PREDICT, 0), (ModeKeys.PREDICT, 1), (ModeKeys.TRAIN, 2),
    ]
    final = {n: p.detach().numpy() for n, p in model.named_parameters()}
    np.testing.assert_array_equal(trial.tensor("fc1.weight").value(0, mode=ModeKeys.EVAL), final["fc1.weight"])
    np.testing.assert_array_equal(trial.tensor("fc1.weight").value(0, mode=ModeKeys.TRAIN), seen[0]["weights"]["fc1.weight"].numpy())
    assert len(eval_losses) == 3


@pytest.mark.parametrize("register_optimizer", [True, False], ids=["optimizer-driven", "forward-driven"])
def test_a_forward_without_autograd_in_training_mode_is_an_eval_step(make_hook, mlp, batches, out_dir, register_optimizer):
    # pytorch/examples' time_sequence_prediction predicts under torch.no_grad() between
    # optimizer steps without model.eval(); a validation loop that forgets eval() does the
    # same. Such a forward trains nothing: an EVAL step whose loss is an EVAL loss, not a
    # TRAIN step that no update follows (the example's last prediction was a 16th TRAIN step
    # whose "training loss" was the test loss). Inside an open TRAIN step (targets computed
    # before the update) it stays a forward of that step.
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["gradients"])
    model, loss_fn = mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    if register_optimizer:
        hook.register_optimizer(optimizer)
    train_losses, eval_losses = [], []
    for x, y in batches(3):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        train_losses.append(loss.item())
        loss.backward()
        if register_optimizer:
            with torch.no_grad():  # inside the TRAIN step the update closes: a forward of it
                model(x)
        optimizer.step()
        with torch.no_grad():  # training mode, no autograd: an evaluation
            eval_losses.append(loss_fn(model(x), y).item())
    with torch.inference_mode():
        model(batches(1, seed=5)[0][0])
    assert (hook.global_step, hook.mode, hook.mode_step(ModeKeys.TRAIN), hook.mode_step(ModeKeys.EVAL)) == (6, ModeKeys.EVAL, 3, 4)  # the open step's number
    hook.close()

    trial = stepscope.create_trial(out_dir)
    assert [trial.mode_of(s) for s in trial.steps()] == [(m, i) for i in range(3) for m in (ModeKeys.TRAIN, ModeKeys.EVAL)]
    loss = trial.tensor("CrossEntropyLoss_output_0")
    assert [float(loss.value(s, mode=ModeKeys.TRAIN)) for s in range(3)] == pytest.approx(train_losses, rel=1e-6)
    assert [float(loss.value(s, mode=ModeKeys.EVAL)) for s in range(3)] == pytest.approx(eval_losses, rel=1e-6)
    assert trial.tensor("gradient/fc1.weight").steps(mode=ModeKeys.TRAIN) == [0, 1, 2]


def test_eval_losses_saved_from_the_registered_loss_module(make_hook, mlp, batches, out_dir):
    hook = make_hook(save_config=SaveConfig(save_interval=1))
    model, loss_fn = mlp(), nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    model.eval()
    losses = []
    with torch.no_grad():
        for x, _ in batches(3):
            losses.append(loss_fn(model(x), torch.zeros(4, 3)).item())
    hook.close()
    tensor = stepscope.create_trial(out_dir).tensor("MSELoss_output_0")
    assert tensor.steps(mode=ModeKeys.EVAL) == [0, 1, 2]
    assert [float(tensor.value(s, mode=ModeKeys.EVAL)) for s in range(3)] == pytest.approx(losses, rel=1e-6)


def test_frozen_parameters_have_weights_but_no_gradients(make_hook, mlp, batches, out_dir):
    model = mlp()
    model.fc1.requires_grad_(False)
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"])
    seen = train(model, batches(2), hook)
    hook.close()
    trial = stepscope.create_trial(out_dir)
    assert "fc1.weight" in trial.tensor_names()
    assert "gradient/fc1.weight" not in trial.tensor_names()
    np.testing.assert_array_equal(trial.tensor("gradient/fc2.weight").value(1), seen[1]["grads"]["fc2.weight"].numpy())
    np.testing.assert_array_equal(trial.tensor("fc1.weight").value(1), seen[0]["weights"]["fc1.weight"].numpy())  # frozen: unchanged


def test_without_an_optimizer_each_forward_is_a_step(make_hook, mlp, batches, out_dir):
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["gradients"])
    seen = train(mlp(), batches(3), hook, register_optimizer=False)
    hook.close()
    trial = stepscope.create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2]
    for step in range(3):
        np.testing.assert_array_equal(trial.tensor("gradient/fc1.weight").value(step), seen[step]["grads"]["fc1.weight"].numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_without_an_optimizer_a_cpu_gradient_is_saved_directly_and_as_the_general_path_saves_it(make_hook, mlp, batches, tmp_path, monkeypatch, dtype):
    # The routine case (a CPU gradient, no GradScaler) is snapshotted in the gradient hook
    # itself (model_tensors._record_host_gradient), not through the layers every value
    # takes: the same values and shapes either way, and the same as the model's own.
    from stepscope_torch import model_tensors

    direct = []
    record = model_tensors.ModelTensors._record_host_gradient
    monkeypatch.setattr(model_tensors.ModelTensors, "_record_host_gradient", lambda self, plan, grad: direct.append(plan.name) or record(self, plan, grad))
    data = [(x.to(dtype), y) for x, y in batches(3)]
    jobs, seen = {}, {}
    for route in ("direct", "general"):
        if route == "general":
            monkeypatch.setattr(model_tensors, "host_tensor", lambda tensor: False)
        jobs[route] = tmp_path / route
        hook = make_hook(out_dir=jobs[route], save_config=SaveConfig(save_interval=1), include_collections=["gradients"])
        seen[route] = train(mlp().to(dtype), data, hook, register_optimizer=False)
        hook.close()
        if route == "direct":
            assert len(direct) == 3 * len(list(mlp().parameters()))
    assert len(direct) == 3 * len(list(mlp().parameters()))  # (none more by the general route)
    direct_trial, general_trial = stepscope.create_trial(str(jobs["direct"])), stepscope.create_trial(str(jobs["general"]))
    names = direct_trial.tensor_names(collection="gradients")
    assert names and names == general_trial.tensor_names(collection="gradients")
    for name in names:
        for step in range(3):
            value = direct_trial.tensor(name).value(step)
            np.testing.assert_array_equal(value, general_trial.tensor(name).value(step))
            expected = seen["direct"][step]["grads"][name.removeprefix("gradient/")]
            np.testing.assert_array_equal(value, expected.float().numpy().astype(value.dtype) if dtype == torch.bfloat16 else expected.numpy())


@pytest.mark.parametrize("collections", [["weights"], ["gradients"], ["weights", "gradients"]])
def test_without_an_optimizer_only_the_due_gradients_get_a_hook(make_hook, mlp, batches, out_dir, collections):
    # Gradients are read as backward accumulates them: a hook per parameter, only at steps
    # where a collection saves that parameter's gradient. Weights alone due: backward calls
    # no Python at all.
    hook = make_hook(save_config=SaveConfig(save_interval=2), include_collections=collections)
    model = mlp()
    hook.register_module(model)
    hooks_per_step = []
    for x, y in batches(4):
        output = model(x)  # (the step is open: its hooks are in place until the next one begins)
        hooks_per_step.append(sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters()))
        nn.functional.cross_entropy(output, y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad = None
    hook.close()
    n = len(list(model.parameters()))
    expected = n if "gradients" in collections else 0
    assert hooks_per_step == [expected, 0, expected, 0]
    trial = stepscope.create_trial(out_dir)
    assert bool(trial.tensor_names(collection="gradients")) == ("gradients" in collections)
    if "gradients" in collections:
        assert trial.tensor("gradient/fc1.weight").steps() == [0, 2]


def test_activations_of_modules_chosen_by_regex(make_hook, mlp, batches, out_dir):
    relu = Collection("relu_activations", include_regex=[r"^relu_output_\d+$"])
    hook = make_hook(save_config=SaveConfig(save_interval=2), collections=[relu], include_collections=["inputs"])
    model = mlp()
    data = batches(3)
    seen_inputs = [x for x, _ in data]
    expected = [torch.relu(model.fc1(x)).detach() for x in seen_inputs]  # before training changes fc1
    hook.register_module(model)
    model(data[0][0])  # step 0 (due), no optimizer: each forward is a step
    model(data[1][0])  # step 1 (not due)
    hook.close()
    trial = stepscope.create_trial(out_dir)
    assert trial.tensor("relu_output_0").steps() == [0]
    np.testing.assert_array_equal(trial.tensor("relu_output_0").value(0), expected[0].numpy())
    np.testing.assert_array_equal(trial.tensor("TinyMLP_input_0").value(0), seen_inputs[0].numpy())
    assert "fc1_output_0" not in trial.tensor_names()  # not chosen by any included collection
    assert trial.collection("relu_activations").tensor_names == {"relu_output_0"}
    # The module class of each activation the hook saw, for rules that look for ReLUs.
    assert trial.module_class("relu_output_0") == "ReLU"
    assert trial.module_class("TinyMLP_input_0") == "TinyMLP"


def test_nothing_happens_on_steps_where_nothing_is_due(make_hook, mlp, batches, monkeypatch):
    hook = make_hook(save_config=SaveConfig(save_interval=4), save_all=True)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    calls = []
    original_plan = hook.plan
    monkeypatch.setattr(hook, "plan", lambda *a, **k: calls.append(a[0]) or original_plan(*a, **k))
    work_per_step, activation_hooks = [], []
    for x, y in batches(6):
        calls.clear()
        optimizer.zero_grad()
        output = model(x)
        activation_hooks.append(len(model.fc1._forward_hooks))
        nn.functional.cross_entropy(output, y).backward()
        optimizer.step()
        work_per_step.append(len(calls))
    assert work_per_step[0] > 0 and work_per_step[4] > 0
    assert [work_per_step[i] for i in (1, 2, 3, 5)] == [0, 0, 0, 0]
    assert activation_hooks == [1, 0, 0, 0, 1, 0]  # activation hooks exist only during due steps


def test_save_steps_of_the_same_collections_plan_their_tensors_once(make_hook, mlp, batches, out_dir, monkeypatch):
    # Each step that saves weights and gradients is due the same collections: what the hook
    # worked out at the first (each tensor's plan; the registered loss's, keyed by the due
    # names object) serves the next ones, so a save step costs the training thread its
    # copies, not planning again. (The loss's part failed before save steps shared one
    # names object: its general path ran at every save.)
    hook = make_hook(save_config=SaveConfig(save_interval=2), include_collections=["weights", "gradients", "losses"])
    model, loss_fn = mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    planned, general = [], []
    real_plan, real_io = hook._saver._plan, hook._save_io
    monkeypatch.setattr(hook._saver, "_plan", lambda *a: planned.append(a[0]) or real_plan(*a))
    monkeypatch.setattr(hook, "_save_io", lambda *a: general.append(a[0]) or real_io(*a))
    per_step, losses = [], []
    for x, y in batches(8):
        planned.clear(), general.clear()
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        per_step.append((len(planned), len(general)))
    hook.close()
    assert per_step[0][0] >= 2 * len(list(model.parameters())) and per_step[0][1] == 1  # the first save step plans
    assert per_step[2::2] == [(0, 0)] * 3  # the next ones find it
    trial = stepscope.create_trial(out_dir)
    assert trial.steps() == list(range(0, 8, 2))
    loss_name = next(n for n in trial.tensor_names(collection="losses"))
    assert [float(trial.tensor(loss_name).value(s)) for s in range(0, 8, 2)] == pytest.approx(losses[0::2], rel=1e-6)
    for name, _ in model.named_parameters():
        assert trial.tensor(f"gradient/{name}").steps() == list(range(0, 8, 2))


def test_save_tensor_and_scalar(make_hook, mlp, batches, out_dir, caplog):
    hook = make_hook(save_config=SaveConfig(save_interval=1), collections=[Collection("custom")])
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    for step, (x, y) in enumerate(batches(2)):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        # After optimizer.step() the step still takes values until the next one begins.
        hook.save_scalar("accuracy", 0.5 + step)
        hook.save_tensor("logits_mean", torch.full((3,), float(step)), collections=["custom"])
        hook.save_tensor("mine", torch.full((2,), float(step)))  # "default": always included
    hook.save_tensor("lost", torch.ones(2), collections="nope")  # not included: warned about, not saved
    hook.close()
    trial = stepscope.create_trial(out_dir)
    assert [float(trial.tensor("accuracy").value(s)) for s in (0, 1)] == [0.5, 1.5]
    np.testing.assert_array_equal(trial.tensor("logits_mean").value(1), np.full(3, 1.0, dtype=np.float32))
    np.testing.assert_array_equal(trial.tensor("mine").value(1), np.full(2, 1.0, dtype=np.float32))
    assert "lost" not in trial.tensor_names()
    assert "not included" in caplog.text and "['nope']" in caplog.text


@pytest.mark.heavy  # torch.compile (eager backend) takes a few seconds
def test_wrapped_and_compiled_models_keep_plain_names(make_hook, mlp, batches, out_dir, tmp_path):
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"], collections=[Collection("fc2_out", include_regex=["^fc2_output"])])
    model = mlp()
    compiled = torch.compile(nn.DataParallel(model), backend="eager")
    seen = train(compiled, batches(2), hook)
    hook.close()
    trial = stepscope.create_trial(out_dir)
    assert {"fc1.weight", "gradient/fc1.weight", "fc2_output_0"} <= set(trial.tensor_names())
    assert not [n for n in trial.tensor_names() if "module" in n or "_orig_mod" in n]
    np.testing.assert_array_equal(trial.tensor("gradient/fc1.weight").value(1), seen[1]["grads"]["_orig_mod.module.fc1.weight"].numpy())


def test_bad_arguments_fail_at_construction(tmp_path):
    with pytest.raises(ConfigError, match="unknown collection"):
        Hook(str(tmp_path / "a"), include_collections=["nope"])
    with pytest.raises(ConfigError, match="bad regular expression"):
        Hook(str(tmp_path / "b"), include_regex="([")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        Hook(str(tmp_path / "file"))
    with pytest.raises(ConfigError, match="include_workers"):
        Hook(str(tmp_path / "c"), include_workers="some")
    assert not (tmp_path / "a").exists()


def test_stop_request_raises_at_the_end_of_the_step(make_hook, mlp, batches):
    hook = make_hook()
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    steps_done = 0
    with pytest.raises(StopTrainingRequested):
        for i, (x, y) in enumerate(batches(4)):
            if i == 2:
                request_stop(hook.store, rule="LossNotDecreasing", reason="test")
                hook.stop_poller.check_now()  # the poller's thread would see it within 2 s
                before = model.fc1.weight.detach().clone()
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            steps_done += 1
    assert steps_done == 2 and hook.stop_requested
    assert not torch.equal(before, model.fc1.weight)  # step 2's update was done before the raise


def test_from_json_reads_smdebug_hook_config(tmp_path, mlp, batches):
    out = tmp_path / "job"
    config = {
        "LocalPath": str(out),
        "HookParameters": {"save_interval": "2", "include_workers": "one"},
        "CollectionConfigurations": [{"CollectionName": "weights", "CollectionParameters": {"save_interval": "1"}}],
    }
    path = tmp_path / "debughookconfig.json"
    path.write_text(json.dumps(config))
    from stepscope.config import ProfilerConfig

    hook = Hook.from_json(str(path), profiler_config=ProfilerConfig.disabled())
    train(mlp(), batches(3), hook)
    hook.close()
    trial = stepscope.create_trial(str(out))
    assert trial.tensor("fc1.weight").steps() == [0, 1, 2]
    assert trial.tensor("CrossEntropyLoss_output_0").steps() == [0, 2]


def test_context_manager_closes(tmp_path, mlp, batches):
    from stepscope.config import ProfilerConfig

    with Hook(str(tmp_path / "job"), profiler_config=ProfilerConfig.disabled()) as hook:
        train(mlp(), batches(1), hook)
    assert (tmp_path / "job" / "training_job_end.ts").exists()
    assert not hook.enabled


class _GraphAttention(nn.Module):
    """Parameters named as pytorch/examples' gat/main.py names them (`W`, `a`), not `weight`."""

    def __init__(self) -> None:
        super().__init__()
        self.W = nn.Parameter(torch.randn(6, 4))
        self.a = nn.Parameter(torch.randn(8, 1))
        self.head_bias = nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.W
        score = torch.cat([h, h], dim=1) @ self.a
        return torch.softmax(score, dim=0) * h + self.head_bias


def test_parameters_named_otherwise_are_weights(make_hook, out_dir):
    """Every parameter but a bias is in "weights", whatever its name: the rules that read
    weights (WeightUpdateRatio, AllZero, VanishingGradient) judge such models too."""
    torch.manual_seed(0)
    model = nn.Sequential(_GraphAttention(), nn.Linear(4, 3))
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["weights", "biases", "gradients"])
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_optimizer(optimizer)
    x = torch.randn(5, 6)
    expected = {}
    for step in range(2):
        expected[step] = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    hook.close()
    trial = stepscope.create_trial(out_dir)
    assert set(trial.tensor_names(collection="weights")) == {"0.W", "0.a", "1.weight"}
    assert set(trial.tensor_names(collection="biases")) == {"0.head_bias", "1.bias"}
    for step, params in expected.items():
        for name, value in params.items():
            np.testing.assert_array_equal(trial.tensor(name).value(step, mode=ModeKeys.TRAIN), value.numpy(), err_msg=f"{name} at {step}")


@pytest.mark.parametrize(("collections", "register_optimizer"), [
    (["gradients"], False),  # each gradient copied in its hook (post-accumulate)
    (["gradients"], True),  # the gradients copied at the optimizer's step
    (["weights", "outputs"], False),  # the weights at the step's start; the modules' outputs in their forward hooks
])
def test_the_cost_meter_counts_the_copies_of_a_save_step(make_hook, mlp, batches, out_dir, monkeypatch, collections, register_optimizer):
    # The published hook time holds every copy a save step makes on the training thread.
    # It once held only the gradient hooks' `record`: their copies, made before it, went
    # uncounted (0.26 of 0.6 ms a step for an MLP saving weights and gradients).
    from stepscope_torch.transfer import HostTransfer

    copies = []
    capture_host = HostTransfer.capture_host

    def slow_copy(self, plan, tensor):
        copies.append(plan.name)
        time.sleep(0.01)  # (a copy that takes 10 ms: the meter must see each)
        return capture_host(self, plan, tensor)

    monkeypatch.setattr(HostTransfer, "capture_host", slow_copy)
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=collections)
    train(mlp(), batches(3), hook, register_optimizer=register_optimizer)
    hook.close()
    assert len(copies) >= 3 * 2
    (cost_file,) = Path(out_dir, "stepscope-cost").glob("*.json")
    cost = json.loads(cost_file.read_text())
    assert cost["hook_s"] >= 0.01 * len(copies), (cost["hook_s"], copies)


def _train_phases(hook, model, loss_fn, optimizer, batches, register_optimizer, out_dir, wait_s=0.0):
    """Train `model` under `hook` (waiting `wait_s` before each batch, as a data loader
    would), close it, and return the TRAIN steps' phase durations (ms; a row per step)."""
    hook.register_module(model)
    hook.register_loss(loss_fn)
    if register_optimizer:
        hook.register_optimizer(optimizer)
    for x, y in batches:
        time.sleep(wait_s)  # the data loader
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    hook.close()
    return _phase_table(out_dir)


def _phase_table(out_dir):
    """The job's TRAIN steps' phase durations (ms; a row per step)."""
    timeline = stepscope.create_trial(out_dir).profiler.step_timeline()
    train = timeline[timeline["mode"] == "TRAIN"]
    return train.pivot_table(index="step", columns="phase", values="duration_ms", aggfunc="sum", observed=True).fillna(0.0)


class _SlowSGD(torch.optim.SGD):
    """SGD whose update takes UPDATE_S longer: the optimizer phase the timeline must show."""

    UPDATE_S = 0.03

    def step(self, closure=None):
        time.sleep(self.UPDATE_S)
        return super().step(closure)


@pytest.mark.parametrize("register_optimizer", [False, True])
def test_the_wait_for_the_next_batch_is_the_next_steps_data_phase(make_hook, mlp, batches, out_dir, register_optimizer):
    # The loop waits 30 ms for each batch after the optimizer's update. With a registered
    # optimizer its step ends the TRAIN step, and the wait is the next step's `data`.
    # Without one the step ends at the next forward, and the wait was timed as the step's
    # backward (a loop waiting for data half its time read 0 % data); now the update ends
    # the step's timeline, so the wait is `data` either way.
    from stepscope.config import ProfilerConfig

    wait_s = 0.03
    model, loss_fn = mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = make_hook(profiler_config=ProfilerConfig(system_monitor=False), save_config=SaveConfig(save_interval=2), include_collections=["weights", "gradients"])
    per_step = _train_phases(hook, model, loss_fn, optimizer, batches(6), register_optimizer, out_dir, wait_s=wait_s)
    later = per_step.loc[1:]  # (the first step has no previous end to wait from)
    assert len(later) == 5
    assert (later["data"] >= 0.9 * wait_s * 1e3).all(), later
    assert later["backward"].median() < wait_s * 1e3, later  # (median: a step on a loaded machine may be slow)
    # The phases still tile each step; the gradients of the due steps are still saved.
    steps = per_step.loc[:, [p for p in per_step.columns if p not in ("step",)]].sum(axis=1)
    np.testing.assert_allclose(steps, per_step["step"], rtol=1e-6)
    assert stepscope.create_trial(out_dir).tensor_names(collection="gradients")


@pytest.mark.parametrize("register_optimizer", [False, True])
def test_clipped_gradients_are_saved_where_the_docs_say(make_hook, out_dir, register_optimizer):
    # docs/pytorch.md: with a registered optimizer the gradients are read right before the
    # update (after the loop clipped them); without one, as backward accumulates them.
    torch.manual_seed(0)
    model, loss_fn = nn.Linear(8, 2), nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["gradients"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    if register_optimizer:
        hook.register_optimizer(optimizer)
    optimizer.zero_grad()
    loss_fn(model(torch.randn(4, 8) * 100), torch.randn(4, 2)).backward()
    computed = model.weight.grad.clone()
    nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    used = model.weight.grad.clone()
    optimizer.step()
    hook.close()
    assert not torch.allclose(computed, used)
    saved = stepscope.create_trial(out_dir).tensor("gradient/weight").value(0)
    np.testing.assert_allclose(saved, (used if register_optimizer else computed).numpy(), rtol=1e-6)


@pytest.mark.parametrize("register_optimizer", [False, True])
def test_the_update_is_the_steps_optimizer_phase(make_hook, mlp, batches, out_dir, register_optimizer):
    # An optimizer whose update takes 30 ms. Without a registered optimizer the update was
    # timed as the step's backward, and the step had no optimizer phase (an Adam step of
    # 14 ms after a 5 ms backward read as a 19 ms backward); a pre-hook on every optimizer
    # now marks where the update starts, as a registered optimizer's own pre-hook does.
    from stepscope.config import ProfilerConfig

    update_s = _SlowSGD.UPDATE_S

    model, loss_fn = mlp(), nn.CrossEntropyLoss()
    optimizer = _SlowSGD(model.parameters(), lr=0.1)
    hook = make_hook(profiler_config=ProfilerConfig(system_monitor=False))
    per_step = _train_phases(hook, model, loss_fn, optimizer, batches(5), register_optimizer, out_dir)
    assert len(per_step) == 5
    assert "optimizer" in per_step.columns, per_step
    assert (per_step["optimizer"] >= 0.9 * update_s * 1e3).all(), per_step
    assert per_step["backward"].median() < update_s * 1e3, per_step  # (median: a step on a loaded machine may be slow)


def test_an_optimizer_seen_before_its_model_was_registered_is_asked_again(make_hook, mlp, batches, out_dir):
    # The watch hooks remember, per optimizer, whether it updates a watched parameter. One
    # that stepped while its model was not registered yet must be asked again once it is.
    from stepscope.config import ProfilerConfig

    update_s = _SlowSGD.UPDATE_S

    first, second = mlp(), mlp()
    optimizer = _SlowSGD(second.parameters(), lr=0.1)
    hook = make_hook(profiler_config=ProfilerConfig(system_monitor=False))
    hook.register_module(first)
    steps = iter(batches(5))

    def step():
        x, y = next(steps)
        optimizer.zero_grad()
        (nn.functional.cross_entropy(first(x), y) + nn.functional.cross_entropy(second(x), y)).backward()
        optimizer.step()

    step()  # (the optimizer updates no watched parameter yet)
    hook.register_module(second, name="second")
    for _ in range(4):
        step()
    hook.close()
    per_step = _phase_table(out_dir)
    assert "optimizer" in per_step.columns, per_step
    assert (per_step.loc[1:, "optimizer"] >= 0.9 * update_s * 1e3).all(), per_step


def test_an_optimizer_the_hook_cannot_read_leaves_training_and_the_timeline_alone(make_hook, mlp, batches, out_dir):
    # The post-hook on every optimizer (no registered one) asks each optimizer once whether
    # it updates a watched parameter; one whose param_groups cannot be read (another
    # make of optimizer) never raises into its step(), and other optimizers go on as usual.
    from stepscope.config import ProfilerConfig

    class Odd(torch.optim.SGD):
        @property
        def param_groups(self):
            if self.__dict__.get("unreadable"):
                raise RuntimeError("not readable")
            return self.__dict__["_groups"]

        @param_groups.setter
        def param_groups(self, value):
            self.__dict__["_groups"] = value

        def step(self, closure=None):  # (SGD's own step reads param_groups)
            return None

    model, other = mlp(), mlp()
    odd = Odd(other.parameters(), lr=0.1)
    odd.unreadable = True
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = make_hook(profiler_config=ProfilerConfig(system_monitor=False))
    hook.register_module(model)
    for x, y in batches(4):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        odd.step()
        optimizer.step()
    hook.close()
    timeline = stepscope.create_trial(out_dir).profiler.step_timeline()
    assert set(timeline[timeline["mode"] == "TRAIN"]["step"]) == {0, 1, 2, 3}
