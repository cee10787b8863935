"""layout.py names every folder and file kind a job holds, and the code takes the names
from there: no other module spells a job folder as a string of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import stepscope
from stepscope import layout

SOURCES = Path(stepscope.__file__).parent
PLUGINS = [SOURCES.parents[2] / "torch_plugin" / "src", SOURCES.parents[2] / "tf_plugin" / "src"]
# Tools that build broken jobs on purpose name the files they break as a user would.
EXEMPT = {"layout.py", "testing/probe_files.py", "testing/hostile_jobs.py", "testing/app_probe.py"}

# A folder or file whose name is ours alone (events/, index/ are checked with their slash:
# the bare words are column names too).
OWN_NAMES = {
    layout.STATUS_DIR, layout.STEP_TABLE_DIR, layout.CONTROL_DIR, layout.COST_DIR, layout.TRACE_TABLE_DIR,
    layout.TRACE_SUMMARY_DIR, layout.PROFILER_DIR, layout.RULE_OUTPUT_DIR, layout.END_MARKER, layout.REPORT_NAME,
    layout.COLLECTIONS_DIR,
}
SHARED_WORDS = {layout.EVENTS_DIR, layout.INDEX_DIR}


def _spells_a_job_path(text: str) -> bool:
    if " " in text or not text:
        return False
    first = text.split("/", 1)[0]
    return text in OWN_NAMES or text.startswith(tuple(f"{name}/" for name in OWN_NAMES)) or (first in SHARED_WORDS and "/" in text)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.add(id(body[0].value))
    return out


def _offenders(root: Path, exempt: set[str]) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in exempt:
            continue
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip and _spells_a_job_path(node.value):
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_spells_a_job_folder_of_its_own():
    offenders = _offenders(SOURCES, EXEMPT)
    for plugin in PLUGINS:
        offenders += _offenders(plugin, set())
    assert offenders == [], "use the names in stepscope/layout.py:\n" + "\n".join(offenders)


def test_the_detector_finds_what_it_should():
    assert _spells_a_job_path("stepscope-traces") and _spells_a_job_path("rule-output/summary.json") and _spells_a_job_path("index/")
    assert not _spells_a_job_path("events") and not _spells_a_job_path("stepscope-trace-read") and not _spells_a_job_path("see rule-output/ for more")


def test_every_folder_is_documented():
    fmt = (SOURCES.parents[3] / "docs" / "format.md").read_text()
    for name in sorted(OWN_NAMES | SHARED_WORDS | {layout.STEP_TIMELINE_DIR, layout.SYSTEM_METRICS_DIR, layout.RULE_SUMMARY_KEY}):
        assert name.split("/")[-1] in fmt, name
