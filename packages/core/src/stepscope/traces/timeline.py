"""Deprecated alias of stepscope.export.perfetto, kept for one release: the merged Perfetto
trace moved there (it draws the rules' firings and the system metrics, a presentation above
the trace engine). Its names resolve on first use, so the trace engine still imports
nothing of the layers above it."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

warnings.warn("stepscope.traces.timeline is deprecated; import write_timeline from stepscope.export.perfetto", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("stepscope.export.perfetto"), name)
