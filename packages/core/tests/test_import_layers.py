"""The import layers that `nox -s lint` enforces (import-linter's contracts in pyproject.toml
and stepscope.testing.import_graph): they hold on the code as it is, and each one breaks when
an import that it forbids is planted in the real graph."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("importlinter")

from importlinter.application import use_cases  # noqa: E402
from importlinter.application.app_config import settings  # noqa: E402
from importlinter.configuration import configure  # noqa: E402

from stepscope.testing.import_graph import NOT_AN_IMPORT, build_graph, describe, import_cycles  # noqa: E402

CONFIG = str(Path(__file__).resolve().parents[3] / "pyproject.toml")


@pytest.fixture(scope="module")
def graph():
    return build_graph()


_CACHE: list[str] = []  # grimp's cache of parsed modules, one per test session (not in the checkout)


@pytest.fixture(scope="module", autouse=True)
def _grimp_cache(tmp_path_factory):
    # Sixteen lint runs each parsing every module took ~20 s apiece on a busy 2-core machine;
    # with the parsed modules cached, the graph builds from the cache after the first.
    _CACHE[:] = [str(tmp_path_factory.mktemp("import-linter-cache"))]
    yield
    _CACHE.clear()


def _lint(contract: str, planted: tuple[str, str] | None = None) -> int:
    """lint-imports' exit status for one contract, on the real graph plus `planted`."""
    configure()
    real = settings.GRAPH_BUILDER

    class Planting:
        def build(self, **options):
            built = real.build(**options)
            if planted:
                built.add_import(importer=planted[0], imported=planted[1])
            return built

    settings.configure(GRAPH_BUILDER=Planting())
    try:
        # The use case, not the command line's entry: that one reconfigures logging and
        # would silence every logger the other tests of this process capture.
        kept = use_cases.lint_imports(config_filename=CONFIG, limit_to_contracts=(contract,), cache_dir=_CACHE[0] if _CACHE else None, no_logo=True)
        return 0 if kept else 1
    finally:
        settings.configure(GRAPH_BUILDER=real)


CONTRACTS = ["capture-apart", "analysis-layers", "no-package-cycles", "plugins-on-contract", "plugins-apart", "core-without-plugins"]


@pytest.mark.parametrize("contract", CONTRACTS)
def test_the_code_keeps_each_contract(contract, capsys):
    assert _lint(contract) == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    ("contract", "planted"),
    [
        ("capture-apart", ("stepscope.capture.writer", "stepscope.rules.base")),
        ("capture-apart", ("stepscope.capture.hook", "pandas")),
        ("analysis-layers", ("stepscope.store.base", "stepscope.trial")),
        ("analysis-layers", ("stepscope.rules.engine", "stepscope.report.build")),
        ("analysis-layers", ("stepscope.job_files", "stepscope.step_index")),
        ("no-package-cycles", ("stepscope.export.hdf5", "stepscope.cli")),
        ("plugins-on-contract", ("stepscope_torch.hook", "stepscope.trial")),
        ("plugins-on-contract", ("stepscope_tf.callback", "stepscope.hook")),
        ("plugins-apart", ("stepscope_tf.callback", "stepscope_torch.hook")),
        ("core-without-plugins", ("stepscope.trial", "torch")),
    ],
)
def test_each_contract_breaks_on_what_it_forbids(contract, planted, capsys):
    assert _lint(contract, planted) == 1
    out = capsys.readouterr().out
    # The report names the import (the cycle contract names it package to package).
    assert planted[0] in out or ".export -> .cli" in out, out


def test_no_module_imports_itself_through_others(graph):
    cycles = import_cycles(graph)
    assert cycles == [], "\n".join(line for group in cycles for line in describe(graph, group))


def test_a_planted_cycle_is_found_with_its_members(graph):
    graph.add_import(importer="stepscope.layout", imported="stepscope.trial")  # trial -> ... -> layout exists
    cycles = import_cycles(graph)
    assert len(cycles) == 1 and {"stepscope.layout", "stepscope.trial"} <= set(cycles[0])
    assert any(line.startswith("stepscope.layout -> stepscope.trial") for line in describe(graph, cycles[0]))
    graph.remove_import(importer="stepscope.layout", imported="stepscope.trial")
    assert import_cycles(graph) == []


def test_the_edges_passed_over_are_really_in_the_graph(graph):
    # An exemption whose edge is gone would hide nothing and should be removed.
    for importer, imported in NOT_AN_IMPORT:
        assert imported in graph.find_modules_directly_imported_by(importer)
