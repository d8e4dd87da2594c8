"""The package's shape: no import cycle among cuquant's modules (every import counted, at
the top of a module or inside a function), imports between layers pointing down only, and
`import cuquant` loading neither the op table nor CuPy, torch or JAX."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import cuquant

PACKAGE = Path(cuquant.__file__).parent

# The layers, lowest first: a module may import modules of its own layer and of the layers
# below it, never above (docs/design.md).
LAYERS = (
    ("dtypes", ("cuquant._core.dtypes",)),
    ("numpy", ("cuquant._numpy",)),
    ("core", ("cuquant._core",)),
    ("cuda", ("cuquant._cuda",)),
    ("ops", ("cuquant.int8", "cuquant.fp8", "cuquant.groupwise", "cuquant.zero_point",
             "cuquant.microscaling")),
    ("api", ("cuquant",)),
    ("applications", ("cuquant.compat", "cuquant.checkpoint")),
    ("command", ("cuquant.cli", "cuquant.__main__")),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The cuquant modules that module `name` imports anywhere in its text."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            # `from package import module` imports the module; `from module import name`
            # the module alone.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> int:
    best = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if name == p or name.startswith(p + "."):
                if best is None or len(p) > best[1]:
                    best = (rank, len(p))
    assert best is not None, f"{name} belongs to no layer: add it to LAYERS"
    return best[0]


def test_every_module_has_a_layer():
    for name in MODULES:
        _layer(name)


def test_no_import_cycle():
    """Depth-first search over the import graph; a back edge is a cycle."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node)


def test_imports_point_down():
    upward = [(a, b) for a, targets in GRAPH.items() for b in targets
              if _layer(b) > _layer(a)]
    assert not upward, "imports from a lower layer to a higher one: " + ", ".join(
        f"{a} -> {b}" for a, b in upward)


def test_import_loads_no_op_table_nor_frameworks():
    code = ("import sys, cuquant\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupy_backends',"
            " 'torch', 'jax', 'jaxlib', 'op_table'))\n"
            "print(','.join(bad))\n")
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=PACKAGE.parent, check=True)
    assert res.stdout.strip() == "", f"import cuquant loaded {res.stdout.strip()}"
