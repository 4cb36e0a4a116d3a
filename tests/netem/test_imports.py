"""netem's import graph: acyclic, independent of fedsim, one home per name.

Every module of the package is found with :func:`pkgutil.walk_packages`, so a
new module is checked without editing this file. Imports are read from the
source with :mod:`ast`, all of them: module level, under ``if TYPE_CHECKING:``
and inside functions, since each is an edge of the dependency graph whether
or not it runs at import time.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import netem

PACKAGE = "netem"


def _modules() -> dict[str, Path]:
    """Every module of netem (name -> source file)."""
    found: dict[str, Path] = {}
    for info in pkgutil.walk_packages(netem.__path__, prefix=f"{PACKAGE}."):
        spec = importlib.util.find_spec(info.name)
        assert spec is not None, info.name
        assert spec.origin is not None, info.name
        found[info.name] = Path(spec.origin)
    return found


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """Absolute name of the module a ``from ... import`` reads from."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_modules(module: str, path: Path) -> set[str]:
    """Every module named by an import statement anywhere in ``path``.

    ``from pkg import name`` counts as an import of ``pkg.name`` when that is
    a module, else of ``pkg``.
    """
    out: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node, is_package)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in MODULES else source)
    return out


def _graph() -> dict[str, set[str]]:
    """Edges among netem modules (importer -> imported)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = {m for m in imported_modules(name, path) if m in MODULES}
        graph[name] = targets
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path ``a -> ... -> a``) per strongly connected
    component that has one (Tarjan's algorithm, then a path inside it)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)

    cycles = []
    for comp in components:
        members, start = set(comp), comp[0]
        # breadth-first from start's successors back to start, inside the component
        prev: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in prev:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        v = prev[start]
        while v != start:
            path.append(v)
            v = prev[v]
        cycles.append([start, *reversed(path[1:]), start])
    return cycles


def test_walk_finds_the_package() -> None:
    assert {"netem.link", "netem.dist", "netem.timers", "netem._check"} <= set(MODULES)


def test_cycle_finder_reports_cycles() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert find_cycles(g) == [["a", "b", "c", "a"], ["d", "d"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_has_no_cycle() -> None:
    cycles = find_cycles(_graph())
    assert cycles == [], "import cycles in netem:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_fedsim() -> None:
    offenders = sorted(
        (name, m)
        for name, path in MODULES.items()
        for m in imported_modules(name, path)
        if m.split(".")[0] == "fedsim"
    )
    assert offenders == []


def test_importing_every_module_loads_no_fedsim_scipy_or_torch() -> None:
    code = (
        "import importlib, sys\n"
        f"for m in {sorted(MODULES)!r}: importlib.import_module(m)\n"
        "top = {m.split('.')[0] for m in sys.modules}\n"
        "bad = top & {'fedsim', 'scipy', 'torch'}\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _defined_names(tree: ast.Module) -> set[str]:
    """Names bound at module level by ``def``, ``class`` or assignment."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _all(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list | tuple)
            return [str(v) for v in value]
    return []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_reexports(name: str) -> None:
    """Each public name has one home: ``__all__`` lists only names the module
    defines itself, and no module re-exports with ``import X as X``."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    redundant = [
        (node.lineno, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
        if alias.asname == alias.name
    ]
    assert redundant == []
    defined = _defined_names(tree)
    assert [n for n in _all(tree) if n not in defined] == []


def test_each_public_name_has_one_home() -> None:
    homes: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for public in _all(ast.parse(path.read_text(), str(path))):
            homes.setdefault(public, []).append(name)
    assert {n: ms for n, ms in homes.items() if len(ms) > 1} == {}


def test_public_names_import_from_their_home() -> None:
    for name in MODULES:
        mod = importlib.import_module(name)
        for public in getattr(mod, "__all__", ()):
            obj = getattr(mod, public)
            home = getattr(obj, "__module__", name)
            if isinstance(home, str) and home.startswith(f"{PACKAGE}."):
                assert home == name, f"{name}.{public} is defined in {home}"
