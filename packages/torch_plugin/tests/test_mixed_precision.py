"""Mixed precision with a GradScaler: gradients are saved unscaled, steps the scaler skips
still end (marked), and half-precision tensors keep their dtype. Reference values come
from a separate float32 backward of the unscaled loss."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import stepscope
from stepscope.config import SaveConfig
from stepscope.modes import ModeKeys

pytestmark = pytest.mark.usefixtures("hot_path")  # both hot paths (conftest.py)


def data(n: int):
    generator = torch.Generator().manual_seed(1)
    # Large inputs with a huge initial scale: the first steps overflow and are skipped.
    return [(torch.randn(4, 6, generator=generator) * 100, torch.randint(0, 3, (4,), generator=generator)) for _ in range(n)]


def train(model, batches, hook=None, register_optimizer=True):
    """A GradScaler loop; per iteration: whether the optimizer stepped, the scale used, and
    the true (unscaled) gradients from a float32 backward of a copy of the model."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**124, growth_interval=2)
    if hook is not None:
        hook.register_module(model)
        if register_optimizer:
            hook.register_optimizer(optimizer)
        hook.register_grad_scaler(scaler)
    seen = []
    for x, y in batches:
        reference = copy.deepcopy(model)
        nn.functional.cross_entropy(reference(x), y).backward()
        stepped = []
        handle = optimizer.register_step_post_hook(lambda *args, seen_step=stepped: seen_step.append(True))
        scale = scaler.get_scale()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        handle.remove()
        seen.append({"stepped": bool(stepped), "scale": scale, "grads": {n: p.grad.clone() for n, p in reference.named_parameters()}})
    return seen


def test_gradients_are_saved_unscaled_and_skipped_steps_end_and_are_marked(make_hook, out_dir, mlp):
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["gradients"])
    seen = train(mlp(), data(8), hook)
    hook.close()
    plain = mlp()
    train(plain, data(8))

    skipped = [i for i, s in enumerate(seen) if not s["stepped"]]
    assert 0 < len(skipped) < len(seen)  # the loop does skip some steps
    trial = stepscope.create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == list(range(8))  # one TRAIN step per iteration, skipped or not
    marks = trial.tensor("grad_scaler/skipped_step").values(mode=ModeKeys.TRAIN)
    assert [step for step, value in marks.items() if value == 1] == skipped
    scales = trial.tensor("grad_scaler/scale").values(mode=ModeKeys.TRAIN)
    assert [float(scales[i]) for i in range(8)] == [s["scale"] for s in seen]
    gradient = trial.tensor("gradient/fc1.weight")
    assert sorted(gradient.steps(mode=ModeKeys.TRAIN)) == [i for i in range(8) if i not in skipped]  # no grads of skipped steps
    for i, record in enumerate(seen):
        if i in skipped:
            continue
        for name, grad in record["grads"].items():
            np.testing.assert_allclose(trial.tensor(f"gradient/{name}").value(i, mode=ModeKeys.TRAIN), grad.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)
            assert np.abs(trial.tensor(f"gradient/{name}").value(i, mode=ModeKeys.TRAIN)).max() < 1e6  # not 2^120 times too big


def test_without_a_registered_optimizer_gradients_are_divided_by_the_scale(make_hook, out_dir, mlp):
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["gradients"])
    seen = train(mlp(), data(6), hook, register_optimizer=False)
    hook.close()
    trial = stepscope.create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == list(range(6))
    for i, record in enumerate(seen):
        if not record["stepped"]:
            continue  # the scaled gradients overflowed: what was saved is what backward made
        for name, grad in record["grads"].items():
            np.testing.assert_allclose(trial.tensor(f"gradient/{name}").value(i, mode=ModeKeys.TRAIN), grad.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)


def test_half_precision_weights_keep_their_dtype(make_hook, tmp_path, mlp, batches):
    for dtype, numpy_name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        model = mlp().to(dtype)
        hook = make_hook(out_dir=tmp_path / numpy_name, save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"])
        hook.register_module(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        hook.register_optimizer(optimizer)
        expected = {}
        for x, y in batches(2):
            expected = {n: p.detach().float().numpy().copy() for n, p in model.named_parameters()}
            loss = nn.functional.cross_entropy(model(x.to(dtype)).float(), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        hook.close()
        saved = stepscope.create_trial(str(tmp_path / numpy_name)).tensor("fc1.weight").value(1, mode=ModeKeys.TRAIN)
        assert saved.dtype.name == numpy_name
        np.testing.assert_array_equal(saved.astype(np.float32), expected["fc1.weight"])
