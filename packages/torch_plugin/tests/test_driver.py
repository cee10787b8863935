"""The forward driver (driver.py): steps from the registered model's own forward, with the
model still a model of its class for everything else (pickling, copies, signature, repr),
and torch's hooks where the class cannot be swapped."""

from __future__ import annotations

import copy
import inspect
import io
import pickle

import pytest
import torch
from torch import nn

from stepscope_torch import Hook
from stepscope_torch.driver import drive_forward

pytestmark = pytest.mark.usefixtures("hot_path")  # every test on both hot paths (conftest.py)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """Net's own docstring."""
        return self.fc(x) * scale


def _driven(model: nn.Module) -> tuple[list[str], object]:
    calls: list[str] = []
    def before(m: nn.Module) -> bool:
        calls.append("before")
        return True  # `after` wanted

    driver = drive_forward(model, before, lambda m, args, out: calls.append(f"after {tuple(out.shape)}"))
    assert driver is not None
    return calls, driver


def test_after_is_called_only_when_before_asks_for_it():
    model = Net()
    x = torch.randn(4, 3)
    calls: list[str] = []
    wanted = iter([False, True, False])

    def before(m: nn.Module) -> bool:
        calls.append("before")
        return next(wanted)

    drive_forward(model, before, lambda m, args, out: calls.append("after"))
    outputs = [model(x) for _ in range(2)] + [model(x, scale=3.0)]
    assert calls == ["before", "before", "after", "before"]
    assert torch.equal(outputs[2], outputs[0] * 3.0)


def test_forward_is_wrapped_and_the_model_keeps_its_face():
    model = Net()
    x = torch.randn(4, 3)
    expected = model(x, scale=2.0)
    calls, driver = _driven(model)
    assert torch.equal(model(x, scale=2.0), expected)
    assert calls == ["before", "after (4, 2)"]
    assert isinstance(model, Net) and type(model).__name__ == "Net" and type(model).__qualname__ == "Net"
    assert inspect.signature(model.forward) == inspect.signature(Net().forward)
    assert list(inspect.signature(model.forward).parameters) == ["x", "scale"]
    assert model.forward.__doc__ == "Net's own docstring."
    assert repr(model) == repr(Net())  # the class's own name, not a subclass's
    driver.remove()
    assert type(model) is Net
    model(x)
    assert len(calls) == 2  # removed: no more calls


def test_copies_and_pickles_are_of_the_original_class_and_not_driven():
    model = Net()
    calls, _ = _driven(model)
    x = torch.randn(2, 3)
    clones = [copy.deepcopy(model), copy.copy(model), pickle.loads(pickle.dumps(model))]
    buffer = io.BytesIO()
    torch.save(model, buffer)
    assert b"stepscope" not in buffer.getvalue()  # loads where stepscope is not installed
    buffer.seek(0)
    clones.append(torch.load(buffer, weights_only=False))
    for clone in clones:
        assert type(clone) is Net
        assert torch.equal(clone(x), model.fc(x))
    assert calls == []  # the clones drove nothing; the model was not called yet
    model(x)
    assert calls == ["before", "after (2, 2)"]


def test_only_the_registered_instance_drives():
    # DataParallel's replicas are made as Module.__new__(type(m)) with m's __dict__ copied.
    model = Net()
    calls, _ = _driven(model)
    replica = type(model).__new__(type(model))
    replica.__dict__ = model.__dict__.copy()
    replica(torch.randn(1, 3))
    assert calls == []


def test_no_swap_where_it_cannot_be_made():
    scripted = torch.jit.script(nn.Linear(2, 2))
    assert drive_forward(scripted, lambda m: None, lambda m, a, o: None) is None
    patched = Net()
    patched.forward = lambda x: x  # a forward set on the instance would hide the class's
    assert drive_forward(patched, lambda m: None, lambda m, a, o: None) is None


def test_hook_falls_back_to_torch_hooks_and_counts_the_same_steps(tmp_path):
    model = Net()
    model.forward = model.forward  # noqa: PLW0127 - an instance forward: no swap, torch hooks
    hook = Hook(str(tmp_path / "job"))
    hook.register_module(model)
    assert type(model) is Net and model._forward_pre_hooks
    for _ in range(3):
        model(torch.randn(2, 3))
    assert hook.global_step == 2  # inside the third step
    hook.close()
    assert not model._forward_pre_hooks


def test_a_torchscript_model_cannot_drive_steps_and_says_so(tmp_path):
    from stepscope.exceptions import ConfigError

    scripted = torch.jit.script(Net())
    hook = Hook(str(tmp_path / "job"))
    with pytest.raises(ConfigError, match="drive_steps=False"):
        hook.register_module(scripted)
    hook.close()
    other = Hook(str(tmp_path / "job2"))
    other.register_module(torch.jit.script(Net()), drive_steps=False)  # parameters only: fine
    other.close()


def test_close_gives_the_class_back_and_deepcopy_works_while_registered(tmp_path):
    model = Net()
    hook = Hook(str(tmp_path / "job"))
    hook.register_module(model)
    assert type(model) is not Net
    ema = copy.deepcopy(model)  # was impossible with the hook's torch hooks on the model
    model(torch.randn(2, 3))
    ema(torch.randn(2, 3))
    assert hook.global_step == 0  # one step: the copy's forward drove none
    hook.close()
    assert type(model) is Net and type(ema) is Net


def test_a_registered_model_compiled_afterwards_runs_compiled_without_recompiling(tmp_path):
    # Dynamo skips stepscope's code (driver.keep_dynamo_out): tracing the hook's counters
    # would recompile at every step, past dynamo's cache limit.
    dynamo = pytest.importorskip("torch._dynamo")
    dynamo.reset()  # what other tests compiled must not count as recompiles here
    model = Net()
    hook = Hook(str(tmp_path / "job"))
    hook.register_module(model)
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(2, 3)
    with dynamo.config.patch(error_on_recompile=True):
        for _ in range(12):
            assert torch.allclose(compiled(x), model.fc(x))
    assert hook.global_step == 11
    hook.close()
