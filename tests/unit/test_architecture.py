"""The structure docs/ARCHITECTURE.md describes, checked from the source: no import cycle (not even
through type hints), no layer importing one above it (imports inside functions count too), no
function over 60 lines, and a file map that lists every module."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pipeflow"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _imports(everywhere: bool, type_hints: bool = False) -> dict[str, set[str]]:
    """``{module: pipeflow modules it imports}``; top-level statements only unless ``everywhere``
    (``if TYPE_CHECKING:`` blocks count only with ``type_hints``: they do not run)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = set() if type_hints else {
            id(n) for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for n in ast.walk(block)}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in (ast.walk(tree) if everywhere else tree.body):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{node.module}" if node.module else anchor
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_no_import_cycle_at_import_time():
    assert _cycles(_imports(everywhere=False)) == []


def test_no_import_cycle_even_through_type_hints_or_imports_inside_functions():
    # a cycle that only type hints or a deferred import hide still ties two modules together:
    # the one below takes a protocol (backends/batch.py's Opens) or owns the type instead
    assert _cycles(_imports(everywhere=True, type_hints=True)) == []


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "pipeflow"


FOUNDATION = {"errors", "_braces", "_checks", "_io", "_fs", "_rng", "_pump", "_meter", "_once", "_usercache",
              "assign", "items", "stats", "run_context", "disk_cache", "keytable"}
ABOVE_STAGES = {"graph", "iterator", "elastic", "offload", "sinks", "pipeline", "loader", "map_dataset",
                "recipes", "_cli", "cli", "testing", "pipeflow"}

#: layer -> the layers it must never import
FORBIDDEN = {
    **{name: ABOVE_STAGES | {"stages", "executor", "backends", "formats"} for name in FOUNDATION},
    "executor": ABOVE_STAGES | {"stages", "backends", "formats"},
    "formats": ABOVE_STAGES | {"stages", "executor", "backends"},
    "backends": ABOVE_STAGES | {"stages", "executor"},
    "stages": ABOVE_STAGES,
    "graph": {"iterator", "offload", "pipeline", "loader", "recipes", "_cli", "cli", "pipeflow"},
    "iterator": {"pipeline", "loader", "recipes", "_cli", "cli", "pipeflow"},
    "elastic": {"iterator", "offload", "pipeline", "loader", "recipes", "_cli", "cli", "pipeflow"},
    "offload": {"pipeline", "loader", "recipes", "_cli", "cli", "pipeflow"},
    "sinks": {"stages", "graph", "pipeline", "loader", "recipes", "_cli", "cli", "pipeflow"},
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_one_above_it(layer):
    wrong = sorted(f"{module} -> {dep}" for module, deps in _imports(everywhere=True).items()
                   if _layer(module) == layer for dep in deps if _layer(dep) in FORBIDDEN[layer])
    assert wrong == []


def test_the_counting_stages_walk_their_upstream_without_the_graph_module():
    # equalize and take(across="all") need the shard their part is cut for: they ask the walks
    # of the stages layer, not the builder above it
    users = sorted(m for m, deps in _imports(everywhere=True).items()
                   if _layer(m) == "stages" and "pipeflow.stages._walks" in deps)
    assert users == ["pipeflow.stages.equalize", "pipeflow.stages.take"]


#: the house limit on a function's length, ``def`` line to last line (docs/ARCHITECTURE.md)
MAX_FUNCTION_LINES = 60


def test_no_function_over_60_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{_module(path)}.{node.name} ({lines} lines)")
    assert long == []


def test_the_file_map_lists_every_module_and_nothing_else():
    # docs/ARCHITECTURE.md's map is the one place a newcomer learns what each file holds; a
    # file added, moved or removed without its row would make it wrong
    root = PACKAGE.parent
    doc = (root / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    mapped = re.findall(r"^\| `((?:pipeflow|benchmarks)/[^`]+\.py)` \|", doc, flags=re.MULTILINE)
    files = sorted(str(p.relative_to(root)) for top in ("pipeflow", "benchmarks")
                   for p in (root / top).rglob("*.py"))
    assert len(mapped) == len(set(mapped)), "a file is mapped twice"
    assert sorted(set(files) - set(mapped)) == [], "files missing from the map"
    assert sorted(set(mapped) - set(files)) == [], "the map lists files that do not exist"
