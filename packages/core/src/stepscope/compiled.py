"""The one switch and loader for stepscope's optional C extensions: the trace parser
(`traces/_kineto.c`), the small-file publisher (`store/_publish.c`), the writer threads'
encoders of held scalar steps and of the step timeline (`capture/_encode.c`) and stepscope-torch's hot path (`_fastpath.c`). Each has a Python path that gives the same results; an extension that
was not built (no C compiler, an unusual platform) or `STEPSCOPE_PURE_PYTHON=1` selects it."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_PYTHON_ENV = "STEPSCOPE_PURE_PYTHON"


def pure_python() -> bool:
    """Whether $STEPSCOPE_PURE_PYTHON asks for the Python paths (set, and not 0)."""
    return os.environ.get(PURE_PYTHON_ENV, "").strip() not in ("", "0")


def load_extension(package: str, name: str) -> ModuleType | None:
    """Extension module `package.name`, or None: not built, or $STEPSCOPE_PURE_PYTHON. (By
    name: `from . import _x` of an extension reads as an import of the package itself to
    the import graph.)"""
    if pure_python():
        return None
    try:
        return importlib.import_module(f"{package}.{name}")
    except ImportError:
        return None


# stepscope's own extensions (the plugins have theirs), by what they do.
EXTENSIONS = {"stepscope.traces._kineto": "trace parser", "stepscope.store._publish": "small-file publisher",
              "stepscope.capture._encode": "writer encoders", "stepscope.capture._batches": "routine batches"}  # fmt: skip


def loaded() -> dict[str, bool]:
    """Which of stepscope's extensions this installation runs (by what they do): an
    extension not built, or all of them under $STEPSCOPE_PURE_PYTHON, reads False."""
    return {what: load_extension(*module.rsplit(".", 1)) is not None for module, what in EXTENSIONS.items()}


def describe() -> str:
    """One line on the compiled paths, for `stepscope --version`."""
    if pure_python():
        return f"Python paths only ({PURE_PYTHON_ENV} is set)"
    state = loaded()
    running = [what for what, on in state.items() if on]
    missing = [what for what, on in state.items() if not on]
    if not running:
        return "Python paths only (no C extension was built)"
    return "compiled: " + ", ".join(running) + (f"; not built: {', '.join(missing)}" if missing else "")


__all__ = ["EXTENSIONS", "PURE_PYTHON_ENV", "describe", "load_extension", "loaded", "pure_python"]
