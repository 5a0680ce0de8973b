"""No import circles: the layers run one way.

``import_graph`` reads a package's sources with ``ast`` and records every
import between its modules, wherever it stands: at the top, under
``if TYPE_CHECKING:``, or inside a function (a lazy import is still a
dependency, only a hidden one). ``find_cycles`` lists the circles. The
package's own ``__init__`` modules, run implicitly by importing one of
their submodules, are not counted as imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KVSCHED = Path(__file__).resolve().parents[1] / "kvsched"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Every module under ``package_dir`` (a package directory, e.g.
    ``kvsched`` or ``kvsched/core``) and the modules of the same top-level
    package it imports, by dotted name. Imports of modules outside
    ``package_dir`` are left out; relative imports are resolved."""
    package_dir = Path(package_dir).resolve()
    root = package_dir
    while (root.parent / "__init__.py").is_file():
        root = root.parent  # the top-level package: names are dotted from it
    modules = {_module_name(p, root): p for p in sorted(package_dir.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    # Relative: from the module's package, level - 1 further up.
                    package = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = package[:len(package) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # ``from pkg import sub`` imports the submodule pkg.sub.
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                # ``import a.b.c`` depends on a.b.c; fall back to the nearest
                # enclosing module this package defines.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: one per strongly connected group of
    two or more modules, as a path that returns to its start (sorted, so a
    failure reads the same every run)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_cycle_through(graph, group) for group in groups)


def _cycle_through(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A circle inside ``group`` (a strongly connected set), from its first module."""
    members = set(group)
    start = group[0]
    # Breadth-first from start back to start, within the group.
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
                if w not in parents:
                    parents[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{group} is not strongly connected")


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_graph_counts_type_checking_function_local_and_relative_imports(tmp_path: Path) -> None:
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "pkg/b.py": "def f():\n    from pkg import c\n    return c\n",
        "pkg/c.py": "from . import a\nimport os\n",
        "pkg/sub/__init__.py": "from .d import D\n",
        "pkg/sub/d.py": "from ..a import x\nimport pkg.sub\n",
    })
    assert import_graph(pkg) == {
        "pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"},
        "pkg.sub": {"pkg.sub.d"}, "pkg.sub.d": {"pkg.a", "pkg.sub"},
    }
    assert find_cycles(import_graph(pkg)) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"],
                                              ["pkg.sub", "pkg.sub.d", "pkg.sub"]]
    # A subpackage's graph names modules the same way, and keeps to itself.
    assert import_graph(pkg / "sub") == {"pkg.sub": {"pkg.sub.d"}, "pkg.sub.d": {"pkg.sub"}}


def test_find_cycles_on_graphs_without_and_with_circles() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}}) == [
        ["a", "b", "a"], ["c", "d", "c"]]


@pytest.mark.parametrize("package", ["core", "."])
def test_no_import_circles(package: str) -> None:
    graph = import_graph((KVSCHED / package).resolve())
    assert len(graph) > 5  # the package was found and read
    assert find_cycles(graph) == []


def test_core_layers_run_one_way() -> None:
    """The edges issue 20 broke stay broken: the scheduler does not reach
    fast-forward, and the policies read a scheduler through a Protocol."""
    graph = import_graph(KVSCHED / "core")
    assert "kvsched.core.fast_forward" not in graph["kvsched.core.scheduler"]
    assert "kvsched.core.scheduler" in graph["kvsched.core.fast_forward"]
    assert "kvsched.core.scheduler" not in graph["kvsched.core.policies"]
    assert graph["kvsched.core.view"] <= {"kvsched.core.output"}


# Each top-level module or subpackage of kvsched and its layer: a module may
# import from its own layer or lower ones only.
LAYERS: dict[str, int] = {
    # shared vocabulary
    "errors": 0, "fields": 0, "jsonfile": 0, "yamlfile": 0, "files": 0, "progress": 0, "version": 0,
    "vllm_versions": 0,
    "config": 1, "request": 1, "hf_config": 1, "scheduler_defaults": 1, "engine_flags": 1,
    # the exact scheduler
    "core": 2,
    # what the scheduler drives: the performance model; the real model
    "perf": 3, "model": 3, "executor": 4, "scenario": 3,
    # the simulator; the engine
    "sim": 5, "engine": 5,
    # pages, calibration, validation and the tuner, built on the simulator
    # the engine behind an HTTP API
    "serve": 6,
    "report": 6, "calibrate": 6, "profile": 6, "validation": 7, "tune": 7,
    # the subcommands, the command line and the package's front door
    "commands": 8, "cli": 9, "": 9,
}


def layer_of(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else ""
    assert key in LAYERS, f"{module}: give kvsched.{key} a layer in LAYERS"
    return LAYERS[key]


def test_imports_run_down_the_layers() -> None:
    graph = import_graph(KVSCHED)
    assert "kvsched.commands.simulate" in graph["kvsched.cli"]  # lazy imports are seen
    upward = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                    if layer_of(b) > layer_of(a))
    assert upward == []
