"""Import cycles among stepscope's modules, for lint (`python -m stepscope.testing.import_graph`
in `nox -s lint`, beside import-linter's contracts in pyproject.toml) and its test.

import-linter's contracts check layers and package-level cycles (`acyclic_siblings`);
this checks the finer thing: no two modules import each other, directly or through others,
counting imports inside functions too (a lazy import still ties the two modules together)
but not those under `if TYPE_CHECKING:`, which never run. Needs grimp (import-linter's
graph builder, a lint tool: not a dependency of stepscope)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

PACKAGES = ("stepscope", "stepscope_torch", "stepscope_tf")
# Edges the graph shows that are no import of one of our modules by another. None now: the
# C extensions, which the graph (Python files only) would record as imports of their
# package (`from . import _fastpath`), are loaded by name (stepscope.compiled).
NOT_AN_IMPORT: set[tuple[str, str]] = set()


def build_graph(packages: Iterable[str] = PACKAGES) -> Any:
    import grimp

    # No cache: lint writes nothing into the checkout and trusts no graph of older files.
    return grimp.build_graph(*packages, exclude_type_checking_imports=True, cache_dir=None)


def import_cycles(graph: Any, ignored: set[tuple[str, str]] = NOT_AN_IMPORT) -> list[list[str]]:
    """Each group of modules that import one another (a strongly connected component of
    more than one module), sorted; empty when the imports form no cycle."""
    imports = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if (m, i) not in ignored) for m in graph.modules}
    # Tarjan's algorithm, iterative (a deep import chain must not hit the recursion limit).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            module, position = work.pop()
            if position == 0:
                index[module] = low[module] = len(index)
                stack.append(module)
                on_stack.add(module)
            targets = imports.get(module, [])
            if position < len(targets):
                work.append((module, position + 1))
                target = targets[position]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
    return sorted(groups)


def describe(graph: Any, group: list[str]) -> list[str]:
    """The imports inside one cycle, `importer -> imported (line n)`, for the message."""
    members = set(group)
    lines = []
    for importer in group:
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported in members and (importer, imported) not in NOT_AN_IMPORT:
                where = ", ".join(str(d["line_number"]) for d in graph.get_import_details(importer=importer, imported=imported))
                lines.append(f"{importer} -> {imported} (line {where})")
    return lines


def main() -> int:
    graph = build_graph()
    cycles = import_cycles(graph)
    for group in cycles:
        print(f"import cycle among {len(group)} modules:", file=sys.stderr)
        for line in describe(graph, group):
            print(f"  {line}", file=sys.stderr)
    print(f"{len(graph.modules)} modules, {len(cycles)} import cycle(s)")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
