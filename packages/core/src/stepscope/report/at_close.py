"""The hook's "report" output (`report=True`): the chief worker writes the job's report
when its hook closes, after the writer published everything. Registered with the training
side by name (stepscope.capture.hook_outputs), so the training process imports the report
only when a hook asks for it."""

from __future__ import annotations

import logging
from typing import Any

from ..capture.hook_outputs import OutputRequest

logger = logging.getLogger("stepscope")


class ReportAtClose:
    def attach(self, writer: Any) -> None:
        return None

    def close(self, store: Any, writer: Any) -> None:
        if store is None:
            return
        from .build import write_report

        written = write_report(store)
        logger.warning("stepscope: report written to %s", written.html)


def report_at_close(request: OutputRequest) -> ReportAtClose | None:
    """The "report" hook output's factory: only the chief worker writes the report."""
    return ReportAtClose() if request.chief and request.setting else None
