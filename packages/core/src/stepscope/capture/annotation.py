"""`stepscope.annotate("name")`: name a region of training code, as a context manager or a
decorator. Inside a detailed profiling window it becomes a framework annotation
(torch.profiler.record_function, tf.profiler.experimental.Trace) so that it shows in the
trace and kernels are attributed to it; outside windows it is a cheap span on the step
timeline (two clock reads and a list append).

This module is the one documented place of global state for annotations: the backends
the plugins register while a window is open, and the timeline sink of the running hook.
Both are set by the plugins, never by users."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# Framework annotation factories, active while a detailed window is open.
_backends: list[Callable[[str], AbstractContextManager[Any]]] = []
# Where spans go outside windows: (name, start_ns, end_ns) -> None; set by the running hook.
_sink: Callable[[str, int, int], None] | None = None
_lock = threading.Lock()


# Kineto writes an annotation's name into its JSON trace between quotes as it is, except
# that it turns a backslash into "/" and drops newlines (torch 2.13): a `"` there makes
# the whole trace invalid JSON. So framework annotations get the name with `"` as `'` and
# other control characters as spaces; no backslash escape survives Kineto's rewrite.
_FRAMEWORK_UNSAFE = {ord('"'): "'", ord("\\"): "/", **{c: " " for c in range(32)}, 127: " "}


def framework_name(name: str) -> str:
    """`name` as it can be handed to a framework's profiler (see _FRAMEWORK_UNSAFE)."""
    return name.translate(_FRAMEWORK_UNSAFE)


def set_backend(factory: Callable[[str], AbstractContextManager[Any]], active: bool) -> None:
    """Open (`active=True`) or close a framework backend; the plugins call this at the
    start and end of a detailed window."""
    with _lock:
        if active and factory not in _backends:
            _backends.append(factory)
        elif not active and factory in _backends:
            _backends.remove(factory)


def set_sink(sink: Callable[[str, int, int], None] | None) -> None:
    """The running hook's timeline (None when no hook runs): `sink(name, start_ns, end_ns)`
    gets every annotation outside a detailed window."""
    global _sink
    with _lock:
        _sink = sink


def clear_sink(sink: Callable[[str, int, int], None]) -> bool:
    """Remove `sink` if it is still the one set (a hook closing must not remove the sink
    of a hook started after it). True when it was."""
    global _sink
    with _lock:
        if _sink != sink:  # (==: bound methods of one object compare equal, not identical)
            return False
        _sink = None
        return True


def current_sink() -> Callable[[str, int, int], None] | None:
    """The sink set now, if any."""
    return _sink


class annotate:  # noqa: N801 - used like a function, as torch.profiler.record_function is
    """`with stepscope.annotate("augment"):` or `@stepscope.annotate("augment")`."""

    __slots__ = ("name", "_framework_name", "_start", "_entered")

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            from ..exceptions import ConfigError

            raise ConfigError(f"annotate: the name must be a non-empty string, got {name!r}")
        self.name = name  # exact, on the step timeline (which stepscope encodes itself)
        self._framework_name = framework_name(name)
        self._start = 0
        self._entered: list[AbstractContextManager[Any]] = []

    def __enter__(self) -> annotate:
        self._entered = []
        for factory in tuple(_backends):
            try:
                context = factory(self._framework_name)
                context.__enter__()
                self._entered.append(context)
            except Exception:  # an annotation never breaks training
                pass
        self._start = time.time_ns()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        end = time.time_ns()
        for context in reversed(self._entered):
            try:
                context.__exit__(*exc_info)
            except Exception:
                pass
        self._entered = []
        sink = _sink
        if sink is not None:
            try:
                sink(self.name, self._start, end)
            except Exception:
                pass

    def __call__(self, function: F) -> F:
        name = self.name

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with annotate(name):
                return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
