"""The package's structure: layers that run one way and no import circles.

Every import counts: module level, inside functions and under
``TYPE_CHECKING`` (a circle there is still a circle in the design).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kvsched"

# Each top-level module or subpackage of kvsched and its layer: a module may
# import from its own layer or lower ones only.
LAYERS: Mapping[str, int] = {
    # 0: shared vocabulary, no kvsched imports beyond this layer
    "errors": 0, "jsonfile": 0, "files": 0, "progress": 0, "version": 0,
    "config": 1, "request": 1, "hf_config": 1, "scheduler_defaults": 1, "engine_flags": 1,
    # the exact scheduler
    "core": 2,
    # what the scheduler drives: the performance model; the real model
    "perf": 3, "model": 3, "executor": 4, "replay": 3,
    # the simulator; the engine
    "sim": 5, "engine": 5,
    # pages and commands built on the simulator
    "report": 6, "calibrate": 6, "validation": 7, "tune": 7,
    # the subcommands, the command line and the package's front door
    "commands": 8, "cli": 9, "__init__": 9,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def import_graph(package_dir: Path = PACKAGE) -> dict[str, set[str]]:
    """kvsched module -> the kvsched modules it imports (every import)."""
    modules = {module_name(p): p for p in package_dir.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.split(".")[0] == "kvsched")
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join([*here, base] if base else here)
                if base.split(".")[0] != "kvsched":
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in modules else base)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def layer_of(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    assert key in LAYERS, f"{module}: give kvsched.{key} a layer in tests/test_layers.py"
    return LAYERS[key]


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    graph = import_graph()
    # kvsched.cli imports the subcommands inside build_parser().
    assert "kvsched.commands.simulate" in graph["kvsched.cli"]


def test_no_import_circles() -> None:
    assert cycles(import_graph()) == []


def test_imports_run_down_the_layers() -> None:
    upward = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
                    if layer_of(b) > layer_of(a))
    assert upward == []
