"""Deprecated alias of stepscope.rules.profiler (the profiler rules moved there) and of the
builders now in stepscope.rules.config; kept for one release."""

import warnings

from ..rules.config import from_rulesconfig, profiler_report_rules
from ..rules.profiler import *  # noqa: F403
from ..rules.profiler import PROFILER_RULES, ProfilerRule, ProfilerTrial, run_profiler_rules

warnings.warn("stepscope.profiler.rules is deprecated; import from stepscope.rules.profiler (rules) or stepscope.rules (builders)", DeprecationWarning, stacklevel=2)

__all__ = ["PROFILER_RULES", "ProfilerRule", "ProfilerTrial", "from_rulesconfig", "profiler_report_rules", "run_profiler_rules"]
