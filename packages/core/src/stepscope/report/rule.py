"""Deprecated alias of stepscope.report.profiler_report (ProfilerReport moved there); kept
for one release."""

import warnings

from .profiler_report import REPORT_KEY, ProfilerReport, ProfilerReportParams, with_companions

warnings.warn("stepscope.report.rule is deprecated; import from stepscope.report.profiler_report", DeprecationWarning, stacklevel=2)

__all__ = ["REPORT_KEY", "ProfilerReport", "ProfilerReportParams", "with_companions"]
