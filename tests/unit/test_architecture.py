"""The layering docs/ARCHITECTURE.md describes, checked from the source: no import cycle, and no
layer importing one above it (imports inside functions count too)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pipeflow"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _imports(everywhere: bool) -> dict[str, set[str]]:
    """``{module: pipeflow modules it imports}``; top-level statements only unless ``everywhere``
    (``if TYPE_CHECKING:`` blocks never count: they do not run)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree)
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


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "pipeflow"


FOUNDATION = {"errors", "_braces", "_checks", "_io", "_fs", "_rng", "assign", "items", "stats",
              "run_context", "disk_cache"}
ABOVE_STAGES = {"graph", "iterator", "elastic", "sinks", "pipeline", "loader", "map_dataset", "recipes", "_cli",
                "cli", "testing", "pipeflow"}

#: layer -> the layers it must never import
FORBIDDEN = {
    **{name: ABOVE_STAGES | {"stages", "executor", "backends", "formats"} for name in FOUNDATION},
    "executor": ABOVE_STAGES | {"stages", "backends", "formats"},
    "formats": ABOVE_STAGES | {"stages", "executor", "backends"},
    "backends": ABOVE_STAGES | {"stages", "executor"},
    "stages": ABOVE_STAGES - {"graph"},
    "graph": {"iterator", "pipeline", "loader", "recipes", "_cli", "cli", "pipeflow"},
    "iterator": {"pipeline", "loader", "recipes", "_cli", "cli", "pipeflow"},
    "elastic": {"iterator", "pipeline", "loader", "recipes", "_cli", "cli", "pipeflow"},
    "sinks": {"stages", "graph", "pipeline", "loader", "recipes", "_cli", "cli", "pipeflow"},
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_one_above_it(layer):
    wrong = sorted(f"{module} -> {dep}" for module, deps in _imports(everywhere=True).items()
                   if _layer(module) == layer for dep in deps if _layer(dep) in FORBIDDEN[layer])
    assert wrong == []


def test_only_the_counting_stages_use_the_graph_walks():
    # equalize and take(across="all") need the shard their part is cut for; no other stage
    # may reach into the graph module
    users = sorted(m for m, deps in _imports(everywhere=True).items()
                   if _layer(m) == "stages" and "pipeflow.graph" in deps)
    assert users == ["pipeflow.stages.equalize", "pipeflow.stages.take"]
