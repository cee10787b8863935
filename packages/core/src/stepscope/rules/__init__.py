"""Rules: checks run over a trial step by step, after training or while it runs, and the
actions taken when one fires. See docs/rules.md."""

from .actions import Action, Log, StopTraining, Webhook, parse_actions
from .activations import DeadRelu, PoorWeightInitialization, SaturatedActivation
from .base import Rule, RuleEvaluationConditionMet, RuleParams, RuleReport, TensorRequest
from .classification import ClassImbalance, Confusion
from .config import collection_configurations, from_config, load_rules_config
from .engine import ReadCache, invoke_rule, run_rules
from .inputs import CheckInputImages, NLPSequenceRatio
from .losses import LossNotDecreasing, Overfit, Overtraining, StalledTrainingRule
from .registry import BUILTIN_RULES, DEFAULT_RULES, load_rule_class, profiler_rules
from .tensors import AllZero, ExplodingTensor, SimilarAcrossRuns, TensorVariance, UnchangedTensor, VanishingGradient, WeightUpdateRatio

__all__ = [
    "Action", "Log", "StopTraining", "Webhook", "parse_actions",
    "Rule", "RuleEvaluationConditionMet", "RuleParams", "RuleReport", "TensorRequest",
    "from_config", "collection_configurations", "load_rules_config",
    "ReadCache", "invoke_rule", "run_rules",
    "BUILTIN_RULES", "DEFAULT_RULES", "load_rule_class", "profiler_rules",
    "VanishingGradient", "ExplodingTensor", "DeadRelu", "SaturatedActivation", "PoorWeightInitialization",
    "WeightUpdateRatio", "AllZero", "UnchangedTensor", "LossNotDecreasing", "Overfit", "Overtraining",
    "SimilarAcrossRuns", "StalledTrainingRule", "TensorVariance", "ClassImbalance", "Confusion",
    "CheckInputImages", "NLPSequenceRatio",
]
