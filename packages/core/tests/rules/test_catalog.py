"""The one rule catalog and the one builder: every kind of rule known by name, third-party
rules registered by entry point, every configuration shape read into one RuleSpec, the
old import paths still working (with a deprecation warning), and `rules/` importing
nothing above it."""

from __future__ import annotations

import ast
import importlib
import json
import sys
import warnings
from pathlib import Path

import pytest

import stepscope.rules
from stepscope.cli import main
from stepscope.exceptions import ConfigError
from stepscope.rules import RuleSpec, build_rule, from_config, from_rulesconfig, rule_spec
from stepscope.rules.registry import BUILTIN_RULES, plugin_rules, rule_class, rule_kind, valid_rule_names

PLUGIN = '''
from dataclasses import dataclass

from stepscope.rules import Rule, RuleParams, TensorRequest


@dataclass(frozen=True)
class LossAboveParams(RuleParams):
    limit: float = 1.0


class LossAbove(Rule):
    """Fires at every step whose loss is above `limit`."""

    Params = LossAboveParams

    def required_tensors(self, step):
        return [TensorRequest("loss", step)]

    def invoke_at_step(self, step):
        loss = self.value("loss", step)
        if loss is not None and float(loss) > self.params.limit:
            self.violation(step, f"loss {float(loss):.3f} > {self.params.limit}", tensor="loss", value=float(loss), threshold=self.params.limit)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A distribution on sys.path that registers LossAbove, and a broken entry, under the
    `stepscope.rules` entry-point group (what `pip install` of a plugin package leaves)."""
    site = tmp_path / "site"
    (site / "my_rules_plugin").mkdir(parents=True)
    (site / "my_rules_plugin" / "__init__.py").write_text(PLUGIN)
    info = site / "my_rules_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-rules-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[stepscope.rules]\nLossAbove = my_rules_plugin:LossAbove\nBroken = my_rules_plugin:NoSuchClass\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield site
    sys.modules.pop("my_rules_plugin", None)


def test_every_kind_of_rule_is_in_the_one_catalog():
    from stepscope.report.profiler_report import ProfilerReport
    from stepscope.rules.profiler import PROFILER_RULES
    from stepscope.rules.traces import TRACE_RULES

    names = set(valid_rule_names())
    assert set(BUILTIN_RULES) | set(PROFILER_RULES) | set(TRACE_RULES) | {"ProfilerReport"} <= names
    assert rule_class("profilerreport") is ProfilerReport and rule_class("HighLaunchLatency") is TRACE_RULES["HighLaunchLatency"]
    assert [rule_kind(n) for n in ("VanishingGradient", "StepOutlier", "MemcpyBoundStep", "ProfilerReport", "x.y:Z")] == ["tensor", "profiler", "profiler", "profiler", "custom"]
    with pytest.raises(ConfigError, match="unknown rule 'NoSuchRule'; valid: VanishingGradient"):
        rule_kind("NoSuchRule")


def test_a_plugin_rule_registered_by_entry_point_runs_in_check(plugin, tmp_path, write_job, caplog, capsys):
    written, _ = write_job(tmp_path / "job", steps=12, eval_steps=0)
    assert "LossAbove" in plugin_rules() and "Broken" not in plugin_rules()
    assert "Broken" in caplog.text and "my_rules_plugin:NoSuchClass" in caplog.text  # named, not fatal
    assert rule_kind("LossAbove") == "tensor" and "LossAbove" in valid_rule_names()
    expected = sorted(step for step, tensors in written.items() if float(tensors["loss"]) > 0.5)
    assert 0 < len(expected) < len(written)  # the job has steps on both sides of the limit
    capsys.readouterr()
    main(["check", str(tmp_path / "job"), "--rule", "LossAbove:limit=0.5", "--json", "--no-write", "--quiet"])
    (report,) = json.loads(capsys.readouterr().out)
    assert report["rule"] == "LossAbove" and report["fired_steps"] == expected and report["violations"] == len(expected)


CONFIGS = [
    ("StepOutlier:stddev=5", RuleSpec("StepOutlier", "StepOutlier", {"stddev": "5"})),
    ({"rule_name": "StepOutlier", "rule_parameters": {"stddev": "5"}}, RuleSpec("StepOutlier", "StepOutlier", {"stddev": "5"})),
    ({"rule_to_invoke": "StepOutlier", "stddev": "5"}, RuleSpec("StepOutlier", "StepOutlier", {"stddev": "5"})),
    ({"RuleConfigurationName": "mine", "RuleParameters": {"rule_to_invoke": "StepOutlier", "stddev": "5"}}, RuleSpec("StepOutlier", "mine", {"stddev": "5"})),
    (
        {"DebugRuleConfiguration": {"RuleConfigurationName": "StepOutlier", "RuleParameters": {"rule_to_invoke": "StepOutlier", "stddev": "5"}}},
        RuleSpec("StepOutlier", "StepOutlier", {"stddev": "5"}),
    ),
]


@pytest.mark.parametrize(("config", "spec"), CONFIGS)
def test_every_configuration_shape_reads_into_one_spec_and_one_rule(config, spec):
    assert rule_spec(config) == spec
    rule = from_config(config, None)
    assert rule.params.stddev == 5.0 and rule.name == ("mine" if spec.name == "mine" else "StepOutlier")
    assert from_rulesconfig(config).params == rule.params == build_rule("StepOutlier", None, {"stddev": "5"}).params


def test_the_builder_names_what_is_wrong():
    with pytest.raises(ConfigError, match="'VanishingGradient' is a tensor rule"):
        from_rulesconfig({"rule_name": "VanishingGradient"})
    with pytest.raises(ConfigError, match="expected key=value, got 'x'"):
        rule_spec("StepOutlier:x")
    with pytest.raises(ConfigError, match="RuleParameters must be an object"):
        rule_spec({"RuleConfigurationName": "a", "RuleParameters": [1]})


@pytest.mark.parametrize(("old", "new", "name"), [
    ("stepscope.profiler.rules", "stepscope.rules.profiler", "StepOutlier"),
    ("stepscope.traces.rules", "stepscope.rules.traces", "HighLaunchLatency"),
    ("stepscope.report.rule", "stepscope.report.profiler_report", "ProfilerReport"),
])
def test_old_import_paths_still_work_and_say_where_to_go(old, new, name, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_old_profiler_names_stay_importable_without_warning():
    from stepscope.rules.config import from_rulesconfig as built
    from stepscope.rules.profiler import StepOutlier

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from stepscope.profiler import StepOutlier as old
        from stepscope.profiler import from_rulesconfig as old_builder
    assert old is StepOutlier and old_builder is built


ABOVE = ("report", "ui", "cli", "export")


def test_rules_import_nothing_above_them():
    """Not even lazily, inside a function: the report, the app, the CLI and the exporters
    sit above the rules (ProfilerReport is named to the catalog as a string)."""
    package = Path(stepscope.rules.__file__).parent
    offending = []
    for source in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2 and (node.module or "").split(".")[0] in ABOVE:
                offending.append(f"{source.name}:{node.lineno} from {'.' * node.level}{node.module}")
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[:2] in ([["stepscope", a] for a in ABOVE]):
                offending.append(f"{source.name}:{node.lineno} from {node.module}")
    assert offending == []


def test_no_import_cycle_among_the_rules_modules():
    """actions <-> base <-> engine and the builder <-> profiler rules no longer import each other both ways."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("stepscope", include_external_packages=False)
    modules = sorted(m for m in graph.modules if m.startswith("stepscope.rules."))
    cycles = [
        (a, b) for a in modules for b in graph.find_modules_directly_imported_by(a)
        if b.startswith("stepscope.rules.") and graph.chain_exists(importer=b, imported=a)
    ]
    assert cycles == []
    assert not graph.chain_exists(importer="stepscope.rules", imported="stepscope.report", as_packages=True)
