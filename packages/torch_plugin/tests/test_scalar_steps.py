"""The torch hook's road for steps that save only losses and metrics (every step under the
capture defaults): a registered loss module is watched by a class swap for its whole life
(no torch hook put on and taken off every step), a CPU loss is read with `.item()`, and the
gradients and optimizer state are not walked. The values read back are the loop's own."""

import pickle

import numpy as np
import pytest
import torch
from torch import nn

from stepscope import create_trial
from stepscope_torch import Hook

LOSS = "CrossEntropyLoss_output_0"


def _train(out, model, loss_fn, steps, *, after_step=None, dtype=None):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    hook = Hook(str(out), include_collections=["gradients", "optimizer_variables"])  # (no save_config: the defaults)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(optimizer)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        output = model(x)
        loss = loss_fn(output if dtype is None else output.to(dtype), y)
        loss.float().backward()
        optimizer.step()
        losses.append(loss.detach().float().item())
        if after_step is not None:
            after_step(loss_fn, y)
    hook.close()
    return create_trial(str(out)), losses


def test_the_loss_is_saved_at_every_step_with_the_loop_s_values(tmp_path, mlp):
    loss_fn = nn.CrossEntropyLoss()
    trial, losses = _train(tmp_path, mlp(), loss_fn, 130)
    assert trial.tensor(LOSS).steps() == list(range(130))
    assert [float(trial.tensor(LOSS).value(s)) for s in range(130)] == [float(np.float32(v)) for v in losses]
    assert trial.tensor(LOSS).value(7).dtype == np.float32 and trial.tensor(LOSS).value(7).shape == ()
    # Tensors keep the default schedule; the gradients are the ones of their steps.
    assert trial.tensor("gradient/fc1.weight").steps() == [*range(10), *range(10, 100, 10), 100]
    # At close the loss module is itself again: no stepscope class, no torch hook left.
    assert type(loss_fn) is nn.CrossEntropyLoss and not loss_fn._forward_hooks
    assert type(pickle.loads(pickle.dumps(loss_fn))) is nn.CrossEntropyLoss


def test_a_loss_computed_after_the_update_belongs_to_no_step(tmp_path, mlp):
    def after_step(loss_fn, y):  # e.g. a logging loss on other outputs, outside the step
        loss_fn(torch.zeros(8, 3), y)

    trial, losses = _train(tmp_path, mlp(), loss_fn := nn.CrossEntropyLoss(), 40, after_step=after_step)
    assert type(loss_fn) is nn.CrossEntropyLoss
    assert [float(trial.tensor(LOSS).value(s)) for s in range(40)] == [float(np.float32(v)) for v in losses]


def test_a_bfloat16_loss_takes_the_general_capture(tmp_path, mlp):
    trial, losses = _train(tmp_path, mlp(), nn.CrossEntropyLoss(), 15, dtype=torch.bfloat16)
    values = [trial.tensor(LOSS).value(s) for s in range(15)]
    assert all(str(v.dtype) == "bfloat16" for v in values)
    assert np.allclose([float(v) for v in values], losses)


def test_a_loss_module_whose_class_cannot_be_swapped_falls_back_to_torch_hooks(tmp_path, mlp):
    loss_fn = nn.CrossEntropyLoss()
    loss_fn.forward = nn.CrossEntropyLoss.forward.__get__(loss_fn)  # a forward on the instance: no swap
    trial, losses = _train(tmp_path, mlp(), loss_fn, 25)
    assert type(loss_fn) is nn.CrossEntropyLoss and not loss_fn._forward_hooks
    assert [float(trial.tensor(LOSS).value(s)) for s in range(25)] == [float(np.float32(v)) for v in losses]


@pytest.mark.parametrize("steps", [3, 120])
def test_scalar_steps_skip_the_parameter_walks(tmp_path, mlp, monkeypatch, steps):
    """After the dense start, a step that saves only the loss reads no gradient and no
    optimizer state (their walks are skipped): counted on the hook's own methods."""
    calls = {"gradients": 0, "states": 0}
    real_gradients, real_states = Hook._save_gradients, Hook._optimizer_states

    def count_gradients(self, *args):
        calls["gradients"] += 1
        return real_gradients(self, *args)

    def count_states(self, *args):
        calls["states"] += 1
        return real_states(self, *args)

    monkeypatch.setattr(Hook, "_save_gradients", count_gradients)
    monkeypatch.setattr(Hook, "_optimizer_states", count_states)
    trial, _ = _train(tmp_path, mlp(), nn.CrossEntropyLoss(), steps)
    tensor_steps = len(trial.tensor("gradient/fc1.weight").steps())
    assert trial.tensor(LOSS).steps() == list(range(steps))
    assert calls["gradients"] == tensor_steps
    assert calls["states"] <= tensor_steps + 1  # (+1: the first scalar step learns the state's names)


def test_a_loss_whose_input_a_collection_holds_saves_it_at_every_step(tmp_path, mlp):
    """The routine loss road (_loss_ends) is taken only where no due collection holds the
    loss's inputs: a collection of the loss's first input, saved every step, gets each one."""
    from stepscope.config import Collection, SaveConfig

    logits = Collection("logits", include_regex=[r"^CrossEntropyLoss_input_0$"], save_config=SaveConfig(save_interval=1))
    seen, losses = [], []
    _sgd(tmp_path, mlp(), 20, 2, dict(collections=[logits], include_collections=["logits"]), lambda step, hook, model, output, loss: (seen.append(output.detach().numpy().copy()), losses.append(loss.item())))
    trial = create_trial(str(tmp_path))
    assert trial.tensor("CrossEntropyLoss_input_0").steps() == list(range(20))
    for step in range(20):
        np.testing.assert_array_equal(trial.tensor("CrossEntropyLoss_input_0").value(step), seen[step])
    assert [float(trial.tensor(LOSS).value(s)) for s in range(20)] == [float(np.float32(v)) for v in losses]


def _sgd(out, model, steps, seed, hook_options, after_step):
    """`steps` SGD steps of `model` on one fixed batch (seeded by `seed`) under
    Hook(out, **hook_options) watching the model, its loss and its optimizer;
    `after_step(step, hook, model, output, loss)` after each."""
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = Hook(str(out), **hook_options)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(optimizer)
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)
    for step in range(steps):
        optimizer.zero_grad()
        output = model(x)
        loss = loss_fn(output, y)
        loss.backward()
        optimizer.step()
        after_step(step, hook, model, output, loss)
    hook.close()


def _train_every_step(out, model, steps, **hook_options):
    """SGD steps under SaveConfig(save_interval=1), as smdebug users save the loss every
    step; a user's values are saved at steps 7 and 9. Returns the trial, the loop's losses
    and the first layer's weight at each step's start."""
    from stepscope.config import SaveConfig

    losses, weights = [], [model.fc1.weight.detach().numpy().copy()]

    def after_step(step, hook, model, output, loss):
        if step == 7:
            hook.save_tensor("note", np.arange(3.0))
        if step == 9:  # (too large to hold: handed to the writer at once)
            hook.save_tensor("large_note", np.arange(300_000.0))
        losses.append(loss.item())
        weights.append(model.fc1.weight.detach().numpy().copy())  # (the next step's start)

    _sgd(out, model, steps, 3, dict(save_config=SaveConfig(save_interval=1), **hook_options), after_step)
    return create_trial(str(out)), losses, weights[:steps]


def test_a_save_config_of_every_step_keeps_loss_steps_routine(tmp_path, mlp, monkeypatch):
    """Under a save_config of every step the default collection (save_tensor's) is due at
    every step too. A step where it holds nothing is still routine: held with the others
    (an event file per batch, not per step), the parameters not walked; the values saved
    at steps 7 and 9 (one too large to hold) are read back at their steps."""
    walks = []
    real_gradients = Hook._save_gradients
    monkeypatch.setattr(Hook, "_save_gradients", lambda self, *args: (walks.append(1), real_gradients(self, *args))[1])
    trial, losses, _ = _train_every_step(tmp_path, mlp(), 30, include_collections=["losses"])
    assert trial.tensor(LOSS).steps() == list(range(30))
    assert [float(trial.tensor(LOSS).value(s)) for s in range(30)] == [float(np.float32(v)) for v in losses]
    assert trial.tensor("note").steps() == [7]
    np.testing.assert_array_equal(trial.tensor("note").value(7), np.arange(3.0))
    assert trial.tensor("large_note").steps() == [9]
    np.testing.assert_array_equal(trial.tensor("large_note").value(9), np.arange(300_000.0))
    event_files = [f for f in (tmp_path / "events").rglob("*.tfevents")]
    assert len(event_files) <= 10, f"{len(event_files)} event files for 30 steps: steps were not held"
    assert not walks


def test_a_default_collection_that_takes_a_parameter_saves_it_at_every_step(tmp_path, mlp):
    # (include_regex adds to the default collection: the parameter walk is then not skipped.)
    trial, _, weights = _train_every_step(tmp_path, mlp(), 12, include_collections=["losses"], include_regex=[r"^fc1\.weight$"])
    assert trial.tensor("fc1.weight").steps() == list(range(12))
    for step in range(12):
        np.testing.assert_array_equal(trial.tensor("fc1.weight").value(step), weights[step])
    assert trial.tensor(LOSS).steps() == list(range(12))
