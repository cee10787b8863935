"""Rules: checks over a training job, and the actions taken when one fires.

One model (see docs/rules.md): `Rule` (step-wise tensor rules) and `JobRule` (whole-job
rules: profiler data, traces) report `Evidence` into a `RuleReport` with the rule's
`Explanation`; `run_rules` runs both kinds and triggers their actions; `default_rules`
is what `stepscope check` runs. Every rule is named in one catalog (rules.registry: tensor,
profiler, trace, report and plugin rules) and built by one builder (rules.config: command
lines, rulesconfig, SageMaker configurations)."""

from .actions import Action, Log, StopTraining, Webhook, parse_actions
from .activations import DeadRelu, PoorWeightInitialization, SaturatedActivation
from .base import JobRule, Rule, RuleEvaluationConditionMet
from .classification import ClassImbalance, Confusion
from .config import (
    RuleSpec,
    build_rule,
    collection_configurations,
    from_config,
    from_rulesconfig,
    load_rules_config,
    parse_rule_spec,
    profiler_report_rules,
    rule_spec,
    rules_from_config,
)
from .engine import invoke_rule, run_rules
from .inputs import CheckInputImages, NLPSequenceRatio
from .losses import ChanceLevelLoss, LossDivergence, LossNotDecreasing, Overfit, Overtraining, SlowConvergence, StalledTrainingRule
from .params import RuleParams, ranged, require
from .reading import ReadCache, TensorReader, TensorRequest
from .registry import (
    BUILTIN_RULES,
    DEFAULT_RULES,
    default_profiler_rules,
    default_rules,
    describe_rules,
    load_rule_class,
    profiler_rules,
    rule_class,
)
from .report import Evidence, Explanation, RuleReport, format_table, jsonable, judged_line, step_label
from .tensors import AllZero, ExplodingTensor, SimilarAcrossRuns, TensorVariance, UnchangedTensor, VanishingGradient, WeightUpdateRatio

__all__ = [
    "Action", "Log", "StopTraining", "Webhook", "parse_actions",
    "Rule", "JobRule", "RuleEvaluationConditionMet", "RuleParams", "ranged", "require",
    "RuleReport", "Evidence", "Explanation", "format_table", "jsonable", "step_label",
    "TensorRequest", "TensorReader", "ReadCache",
    "from_config", "rules_from_config", "collection_configurations", "load_rules_config", "RuleSpec", "rule_spec", "parse_rule_spec",
    "from_rulesconfig", "profiler_report_rules",
    "invoke_rule", "run_rules",
    "BUILTIN_RULES", "DEFAULT_RULES", "default_rules", "default_profiler_rules", "build_rule", "rule_class", "describe_rules", "load_rule_class", "profiler_rules", "judged_line",
    "VanishingGradient", "ExplodingTensor", "DeadRelu", "SaturatedActivation", "PoorWeightInitialization",
    "WeightUpdateRatio", "AllZero", "UnchangedTensor", "LossNotDecreasing", "LossDivergence", "ChanceLevelLoss", "SlowConvergence", "Overfit", "Overtraining",
    "SimilarAcrossRuns", "StalledTrainingRule", "TensorVariance", "ClassImbalance", "Confusion",
    "CheckInputImages", "NLPSequenceRatio",
]
