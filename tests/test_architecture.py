"""The shape of the house: no import cycle among tcl/ modules, nothing imports the CLI, serving
loads neither torch nor MLflow."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "tcl"


def module_name(path: Path, top: Path) -> str:
    parts = list(path.relative_to(top).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the tcl modules it imports anywhere in its body (function-level imports too).
    ``from a.b import c`` points at ``a.b.c`` when that is a module, else at ``a.b``."""
    files = {module_name(p, root.parent): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for t in targets:
                while t and t not in files:  # `import tcl.models.nets.x` -> the deepest known module
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (iterative DFS with colours)."""
    colour = dict.fromkeys(graph, 0)  # 0 new, 1 on the stack, 2 done
    for start in sorted(graph):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour[child] == 1:
                return path[path.index(child):] + [child]
            elif colour[child] == 0:
                colour[child] = 1
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


def test_cycle_finder_finds_a_function_level_cycle(tmp_path):
    pkg = tmp_path / "tcl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from tcl import b\n")
    (pkg / "b.py").write_text("def f():\n    from .c import g\n")
    (pkg / "c.py").write_text("import tcl.a\n")
    graph = import_graph(pkg)
    assert graph["tcl.a"] == {"tcl.b"} and graph["tcl.b"] == {"tcl.c"} and graph["tcl.c"] == {"tcl.a"}
    assert find_cycle(graph) == ["tcl.a", "tcl.b", "tcl.c", "tcl.a"]
    (pkg / "c.py").write_text("import json\n")
    assert find_cycle(import_graph(pkg)) is None


def test_no_import_cycle_among_tcl_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_nothing_imports_the_cli():
    graph = import_graph()
    offenders = {m: sorted(t for t in ts if t.startswith("tcl.cli"))
                 for m, ts in graph.items() if not m.startswith("tcl.cli")}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_serving_imports_neither_torch_nor_mlflow():
    code = ("import sys, tcl.serving; "
            "assert 'torch' not in sys.modules and 'mlflow' not in sys.modules, "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'mlflow'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


# the modules whose code each DVC stage of dvc.yaml runs: its command's module and the stage
# modules that command calls (the command modules are thin dispatchers: only their own file counts,
# their imports serve other commands)
STAGE_CODE = {
    "ingest": ["tcl.cli.data", "tcl.records.ingest", "tcl.hardware"],
    "featurize": ["tcl.cli.data", "tcl.features", "tcl.perstore_extract"],
    "split": ["tcl.cli.data", "tcl.split", "tcl.features", "tcl.perstore"],
    "sample": ["tcl.cli.sampling", "tcl.cli.models", "tcl.sampling", "tcl.sampling.subset", "tcl.features",
               "tcl.config"],
    "ckd": ["tcl.pipeline", "tcl.continual.schedule", "tcl.features", "tcl.hardware", "tcl.config", "tcl.io"],
    "scratch": ["tcl.pipeline", "tcl.experiments", "tcl.hardware", "tcl.config", "tcl.io"],
    "evaluate": ["tcl.pipeline", "tcl.continual.schedule", "tcl.models", "tcl.metrics", "tcl.features",
                 "tcl.hardware", "tcl.config", "tcl.io"],
    "export": ["tcl.cli.lifecycle", "tcl.export", "tcl.registry"],
    "register": ["tcl.pipeline", "tcl.continual.schedule", "tcl.registry", "tcl.export", "tcl.tracking",
                 "tcl.hardware", "tcl.config", "tcl.io"],
}
DISPATCHERS = ("tcl.cli", "tcl.pipeline")


def _closure(graph: dict[str, set[str]], roots: list[str]) -> set[str]:
    seen, todo = set(), list(roots)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if not (m == "tcl.pipeline" or m.startswith("tcl.cli")):
            todo.extend(graph[m])
    return seen


def _module_file(mod: str) -> Path:
    p = REPO.joinpath(*mod.split("."))
    return p / "__init__.py" if p.is_dir() else p.with_suffix(".py")


def test_every_dvc_stage_declares_the_code_it_runs_and_the_hardware_registry():
    import yaml

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert set(stages) == set(STAGE_CODE)
    graph = import_graph()
    for name, stage in stages.items():
        body = stage.get("do", stage)  # foreach: the stage under `do`; matrix / single: the stage itself
        deps = [d for d in body["deps"] if d.startswith("tcl/")]
        assert "tcl/data/hardware.json" in deps, name
        for d in deps:
            assert (REPO / d).exists(), f"{name}: dep {d} does not exist"
        for mod in _closure(graph, STAGE_CODE[name]):
            rel = _module_file(mod).relative_to(REPO).as_posix()
            covered = any(rel == d or rel.startswith(d.rstrip("/") + "/") for d in deps)
            assert covered, f"stage {name} runs {rel} but does not list it (or its folder) in deps"
