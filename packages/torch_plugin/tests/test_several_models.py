"""One hook, several models and optimizers: a GAN loop, a teacher and a student, an EMA copy.
Saved values are compared with those the loop itself read at each step."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import stepscope
from stepscope.config import SaveConfig
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys

pytestmark = pytest.mark.usefixtures("hot_path")  # both hot paths (conftest.py)

LATENT, FEATURES = 4, 6


def gan(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    generator = nn.Sequential(nn.Linear(LATENT, 8), nn.ReLU(), nn.Linear(8, FEATURES))
    discriminator = nn.Sequential(nn.Linear(FEATURES, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
    return generator, discriminator


def train_gan(generator, discriminator, steps: int, hook=None, critic_steps: int = 1):
    """A DCGAN-style loop (discriminator update(s), then generator update); returns what the
    loop saw at each generator step: weights when the batch began, each model's gradients
    right before its own optimizer stepped, and both losses."""
    criterion = nn.BCEWithLogitsLoss()
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-2)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-2)
    if hook is not None:
        hook.register_module(generator, name="generator")
        hook.register_module(discriminator, name="discriminator")
        hook.register_optimizer(opt_d, name="discriminator_adam")
        hook.register_optimizer(opt_g, name="generator_adam")
    data = torch.Generator().manual_seed(3)
    seen = []
    for _ in range(steps):
        record = {
            "weights": {f"generator.{n}": p.detach().clone() for n, p in generator.named_parameters()}
            | {f"discriminator.{n}": p.detach().clone() for n, p in discriminator.named_parameters()},
            "grads": {},
        }
        for _ in range(critic_steps):
            real = torch.randn(5, FEATURES, generator=data) + 2.0
            noise = torch.randn(5, LATENT, generator=data)
            opt_d.zero_grad()
            d_loss = criterion(discriminator(real), torch.ones(5, 1)) + criterion(discriminator(generator(noise).detach()), torch.zeros(5, 1))
            d_loss.backward()
            record["grads"].update({f"gradient/discriminator.{n}": p.grad.clone() for n, p in discriminator.named_parameters()})
            opt_d.step()
        opt_g.zero_grad()
        noise = torch.randn(5, LATENT, generator=data)
        g_loss = criterion(discriminator(generator(noise)), torch.ones(5, 1))
        g_loss.backward()
        record["grads"].update({f"gradient/generator.{n}": p.grad.clone() for n, p in generator.named_parameters()})
        opt_g.step()
        if hook is not None:
            hook.save_loss(d_loss, name="d_loss")
            hook.save_loss(g_loss, name="g_loss")
        record["losses"] = {"d_loss": d_loss.item(), "g_loss": g_loss.item()}
        seen.append(record)
    return seen


@pytest.mark.parametrize("critic_steps", [1, 3])
def test_a_gan_loop_is_one_train_step_per_batch_with_each_models_tensors(make_hook, out_dir, critic_steps):
    generator, discriminator = gan()
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["weights", "biases", "gradients"])
    seen = train_gan(generator, discriminator, 4, hook, critic_steps=critic_steps)
    hook.close()

    trial = stepscope.create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2, 3]  # one step per batch, whatever the critic does
    assert trial.steps(mode=ModeKeys.EVAL) == []
    names = set(trial.tensor_names())
    assert {"generator.0.weight", "discriminator.2.bias", "gradient/generator.2.weight", "gradient/discriminator.0.weight", "d_loss", "g_loss"} <= names
    assert not any(n.startswith(("0.", "2.", "gradient/0.")) for n in names)  # no unprefixed name
    scopes = {s.name: (s.kind, set(s.parameters)) for s in trial.scopes()}
    generator_params = {f"generator.{n}" for n, _ in generator.named_parameters()}
    discriminator_params = {f"discriminator.{n}" for n, _ in discriminator.named_parameters()}
    assert scopes == {
        "generator": ("model", generator_params),
        "discriminator": ("model", discriminator_params),
        "generator_adam": ("optimizer", generator_params),
        "discriminator_adam": ("optimizer", discriminator_params),
    }
    for step, record in enumerate(seen):
        for name, value in record["weights"].items():
            np.testing.assert_array_equal(trial.tensor(name).value(step, mode=ModeKeys.TRAIN), value.numpy(), err_msg=name)
        for name, value in record["grads"].items():
            np.testing.assert_array_equal(trial.tensor(name).value(step, mode=ModeKeys.TRAIN), value.numpy(), err_msg=name)
        for name, value in record["losses"].items():
            assert trial.tensor(name).value(step, mode=ModeKeys.TRAIN) == pytest.approx(value, rel=1e-6)


def test_the_hook_does_not_change_the_training(make_hook):
    plain = train_gan(*gan(), 3)
    hooked = train_gan(*gan(), 3, make_hook(save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"]))
    for a, b in zip(plain, hooked):
        for name in a["weights"]:
            assert torch.equal(a["weights"][name], b["weights"][name])


def test_teacher_in_eval_mode_and_an_ema_copy_make_no_steps_of_their_own(make_hook, out_dir, mlp, batches):
    student, teacher = mlp(), mlp(hidden=16)
    teacher.eval()
    ema = copy.deepcopy(student)
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["weights", "biases", "gradients"])
    hook.register_module(student, name="student")
    hook.register_module(teacher, name="teacher")
    hook.register_module(ema, name="ema", drive_steps=False)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    hook.register_optimizer(optimizer)
    ema_at_start = []
    for x, _ in batches(4):
        ema_at_start.append({n: p.detach().clone() for n, p in ema.named_parameters()})
        with torch.no_grad():
            target = teacher(x).softmax(-1)  # the teacher runs first, in eval mode
        loss = nn.functional.cross_entropy(student(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for e, s in zip(ema.parameters(), student.parameters()):
                e.mul_(0.9).add_(s, alpha=0.1)
    hook.close()

    trial = stepscope.create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2, 3]
    assert trial.steps(mode=ModeKeys.EVAL) == []
    names = set(trial.tensor_names())
    assert {"student.fc1.weight", "teacher.fc1.weight", "ema.fc2.weight", "gradient/student.fc1.weight"} <= names
    assert "gradient/teacher.fc1.weight" not in names  # the teacher is not trained
    for step, expected in enumerate(ema_at_start):
        for name, value in expected.items():
            np.testing.assert_array_equal(trial.tensor(f"ema.{name}").value(step, mode=ModeKeys.TRAIN), value.numpy())


def test_a_second_model_needs_a_name_of_its_own(make_hook):
    generator, discriminator = gan()
    hook = make_hook()
    hook.register_module(generator)
    with pytest.raises(ConfigError, match="its own name"):
        hook.register_module(discriminator)
    hook.register_module(discriminator, name="discriminator")
    with pytest.raises(ConfigError, match="already taken"):
        hook.register_module(nn.Linear(2, 2), name="discriminator")
    with pytest.raises(ConfigError, match="already registered"):
        hook.register_module(discriminator, name="critic")
    with pytest.raises(ConfigError, match="without '/'"):
        hook.register_module(nn.Linear(2, 2), name="a/b")


def test_a_second_hook_on_the_same_folder_is_refused(make_hook, out_dir):
    generator, discriminator = gan()
    first = make_hook()
    first.register_module(generator)
    with pytest.raises(ConfigError, match="being written as worker_0 by another hook"):
        make_hook()  # what the user tried: one hook per model, both on one folder
    first.close()


def test_gan_phases_the_discriminator_forward_is_not_optimizer_time(make_hook, out_dir):
    from stepscope.config import ProfilerConfig
    from stepscope.profiler import STEP_PHASES, create_profiler_trial

    hook = make_hook(profiler_config=ProfilerConfig(system_monitor=False))
    train_gan(*gan(), 4, hook)
    hook.close()
    timeline = create_profiler_trial(out_dir).step_timeline()
    parts = timeline[(timeline["mode"] == "TRAIN") & ~timeline["phase"].isin(STEP_PHASES)]
    assert sorted(parts["step"].unique()) == [0, 1, 2, 3]
    for step, spans in parts.groupby("step"):
        phases = [p for p in spans.sort_values("start_ns")["phase"] if p not in ("data", "other")]
        collapsed = [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]]
        # discriminator: forwards (real, generator, fake), backward, update; then the
        # generator's forward (not optimizer time), backward, update.
        assert collapsed[-3:] == ["forward", "backward", "optimizer"], (step, collapsed)
        assert collapsed.count("optimizer") == 2 and collapsed.index("optimizer") < len(collapsed) - 3, (step, collapsed)
