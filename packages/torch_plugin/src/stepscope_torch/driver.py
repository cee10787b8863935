"""Steps from a model's top-level forward, for the price of one Python call.

A plain loop's steps begin at the model's forward. A torch forward hook would say when, but
any hook on a module sends every call of it down torch's slow path (`Module._call_impl`
builds a closure and walks the hook tables: about 2.5 µs a call here), which is more than a
whole step where nothing is due may cost (bench/bench_torch_hook.py). So the registered
model's class is swapped for a subclass of it whose `forward` tells the hook before and after
running the original one: what torch itself does for parametrizations
(`torch.nn.utils.parametrize`) and FSDP2 (`fully_shard`).

The subclass keeps the class's name, module and docstring, and `inspect.signature(
model.forward)` still gives the original signature. Pickling and copying the model give the
original class: `torch.save(model)` loads without stepscope, and a `copy.deepcopy(model)`
(an EMA model) is not watched. Only the registered instance drives steps (DataParallel's
replicas share its class but not its identity).

Under `torch.compile`, TorchDynamo is told to skip stepscope's code (`keep_dynamo_out`):
tracing into the hook would guard on its counters and recompile at every step. The compiled
model then breaks its graph at the driven forward, the hook runs eagerly and the model's
own forward is compiled as a frame of its own.

Where the swap cannot be made (a TorchScript module, a `forward` set on the instance, a
class that refuses `__class__` assignment) `drive_forward` returns None and the hook falls
back to torch's forward hooks."""

from __future__ import annotations

import copyreg
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch
from torch import nn


class ForwardDriver:
    """Undoes one `drive_forward` swap (`remove()`), like a torch hook handle."""

    def __init__(self, model: nn.Module, base: type, driven: type) -> None:
        self.model = model
        self.base = base
        self.driven = driven
        self.forward: Any = driven.__dict__["forward"]  # (a compiled one has arm() / disarm())

    def remove(self) -> None:
        """Give the model its own class back (when it still has ours: a later swap by
        someone else, e.g. `fully_shard`, is left in place, and our forward goes on calling
        the callbacks, which a closed hook ignores)."""
        if type(self.model) is self.driven:
            self.model.__class__ = self.base


def _can_swap(model: nn.Module) -> bool:
    return not isinstance(model, torch.jit.ScriptModule) and "forward" not in model.__dict__


def _reduce_as(base: type, driven: type) -> Callable[..., Any]:
    """`__reduce_ex__` for the driven class: the base class's, naming the base class.
    Pickle insists that `copyreg.__newobj__` gets the object's own class, so a plain
    object is rebuilt with `copyreg._reconstructor` (what protocols 0 and 1 use), which
    loads anywhere, stepscope installed or not."""

    base_reduce: Callable[[Any, int], Any] = base.__reduce_ex__  # type: ignore[assignment]

    def __reduce_ex__(self: Any, protocol: int) -> Any:
        reduced = base_reduce(self, protocol)
        if not isinstance(reduced, tuple) or len(reduced) < 2 or not isinstance(reduced[1], tuple):
            return reduced
        rebuild, args = reduced[0], reduced[1]
        if rebuild is copyreg.__newobj__ and args == (driven,):  # type: ignore[attr-defined]
            return (copyreg._reconstructor, (base, object, None), *reduced[2:])  # type: ignore[attr-defined]
        if driven in args:
            return (rebuild, tuple(base if a is driven else a for a in args), *reduced[2:])
        return reduced

    return __reduce_ex__


_SKIPPED_PACKAGES = ("stepscope", "stepscope_torch")
_TRACE_RULES = "torch._dynamo.trace_rules"


def _skip_stepscope(trace_rules: ModuleType) -> None:
    for package in _SKIPPED_PACKAGES:
        trace_rules.add(package)


class _WhenDynamoLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when TorchDynamo's trace rules are imported (by the first
    `torch.compile`), makes their loader also skip stepscope's packages, then leaves."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TRACE_RULES:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_skip(module: ModuleType) -> None:
            exec_module(module)
            try:
                _skip_stepscope(module)
            except Exception:  # noqa: BLE001 - a torch without this rule API: compile as before
                pass

        loader.exec_module = exec_and_skip  # type: ignore[union-attr,method-assign]
        return spec


def keep_dynamo_out() -> None:
    """Have TorchDynamo skip stepscope's packages (`torch._dynamo.trace_rules.add`, which
    is what `torch.compiler.disable` amounts to for whole files, with no wrapper to call in
    eager mode): now if it is loaded, else when it is. Idempotent."""
    trace_rules = sys.modules.get(_TRACE_RULES)
    if trace_rules is not None:
        try:
            _skip_stepscope(trace_rules)
        except Exception:  # noqa: BLE001 - a torch without this rule API: compile as before
            pass
    elif not any(isinstance(finder, _WhenDynamoLoads) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenDynamoLoads())


def drive_forward(
    model: nn.Module,
    before: Callable[[nn.Module], object],
    after: Callable[[nn.Module, tuple[Any, ...], Any], None],
    fast: Any = None,
    loss: bool = False,
) -> ForwardDriver | None:
    """Call `before(model)` at the start of each call of `model`'s forward and, when it
    returns a true value, `after(model, args, output)` at its end (the arguments a torch
    forward hook gets: a hook that `before` registers on the model itself would not run in
    the call under way). On most steps there is nothing to do after the forward, and the
    call not made is a third of what the driver costs. With `fast` (the compiled counters,
    fastpath.py) the forward is compiled too: the driven model's (over the same two
    callbacks, given to `fast.attach`), or with `loss` a loss module's, which reads the
    loss itself at a compiled scalar step and otherwise calls these two (its
    `ForwardDriver.forward` is armed for that). None when the model's class cannot be
    swapped."""
    if not _can_swap(model):
        return None
    keep_dynamo_out()
    base = type(model)
    original = base.forward

    # Built per registration: the closure holds this model's callbacks, so the hot path
    # reads no attribute of the model and no table.
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self is not model:
            return original(self, *args, **kwargs)
        wanted = before(self)
        # (Without keywords, the call skips merging an empty dict: this runs every step.)
        result = original(self, *args, **kwargs) if kwargs else original(self, *args)
        if wanted:
            after(self, args, result)
        return result

    if fast is not None:  # the same, in C (fastpath.py)
        forward = fast.loss_forward(model, original, before, after) if loss else fast.forward(model, original)

    functools.update_wrapper(forward, original)  # name, docstring, __wrapped__ (signature)
    namespace = {
        "forward": forward,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
    }
    driven = type(base.__name__, (base,), namespace)
    driven.__reduce_ex__ = _reduce_as(base, driven)  # type: ignore[method-assign]
    driver = ForwardDriver(model, base, driven)
    try:
        model.__class__ = driven
    except TypeError:  # a layout Python will not swap (e.g. __slots__ in the class)
        return None
    return driver
