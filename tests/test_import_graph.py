"""fedsim's import graph: no cycle, no re-export, no private reach, no lazy import without a reason.

Every module of fedsim and netem is found with :func:`pkgutil.walk_packages`
and its imports read with :mod:`ast`, all of them (module level, under
``if TYPE_CHECKING:`` and inside functions): each is an edge of the
dependency graph whether or not it runs at import time. A package's
``__init__`` may gather its own submodules' names (that is its job): those
edges count too, so a submodule that imports its own package's gathered names
(a cycle at import time) fails here.

An import inside a function waits until the function runs; each one says
why on its line (``# lazy: <reason>``), and every other import sits at the
top of its module.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import pkgutil
import re
import tokenize
from pathlib import Path

import fedsim
import netem


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pkg in (fedsim, netem):
        if pkg.__file__ is not None:  # netem is a namespace package
            found[pkg.__name__] = Path(pkg.__file__)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg.__name__}."):
            spec = importlib.util.find_spec(info.name)
            assert spec is not None
            assert spec.origin is not None
            found[info.name] = Path(spec.origin)
    return found


MODULES = _modules()
ROOT = Path(fedsim.__file__).resolve().parents[1]


def _edges(module: str, path: Path) -> set[str]:
    out: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                src = ".".join([*base, *([node.module] if node.module else [])])
            else:
                src = node.module or ""
            names = [f"{src}.{a.name}" if f"{src}.{a.name}" in MODULES else src
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*stack[stack.index(n):], n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    graph = {m: _edges(m, p) for m, p in MODULES.items()}
    assert len(graph) > 40
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_no_module_reexports_a_name_under_an_old_path():
    """``from x import y as y`` is the re-export idiom; none may remain."""
    offenders = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and any(a.asname == a.name for a in node.names):
                offenders.append(f"{module}: line {node.lineno}")
    assert offenders == []


def _private_owner(name: str) -> str | None:
    """The package that private module ``name`` belongs to (its first ``_x`` part's parent)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def test_no_module_imports_another_packages_private_module():
    """A module named ``_x`` is private to its package (and the packages inside it).

    What another package needs has a public name: process plumbing
    (``fedsim.actors.process``), a run's set-up (``fedsim.actors.setup``),
    client-id ranges (``fedsim.scenario.ids``), ``netem.libc``.
    """
    offenders, private = [], 0
    for module, path in MODULES.items():
        for name in sorted(_edges(module, path)):
            owner = _private_owner(name)
            if owner is None:
                continue
            private += 1
            if not (module == owner or module.startswith(owner + ".")):
                offenders.append(f"{module} imports {name}")
    assert private > 20  # the check sees the private imports that are allowed
    assert offenders == []


def test_a_private_name_stays_among_private_modules():
    """``from m import _x`` (a private name, not a module) only between two private
    modules of one package (``fedsim.data._federate`` from ``fedsim.data._build``):
    a name another module needs is public. Tools count too."""
    offenders, seen = [], 0
    paths = {**MODULES, **{f"tools.{p.stem}": p for p in (ROOT / "tools").rglob("*.py")}}
    for module, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
                continue
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                if f"{node.module}.{name}" in MODULES:  # a private module: the test above
                    continue
                seen += 1
                both_private = (module.rpartition(".")[2].startswith("_")
                                and node.module.rpartition(".")[2].startswith("_"))
                same_package = module.rpartition(".")[0] == node.module.rpartition(".")[0]
                if not (both_private and same_package):
                    offenders.append(f"{module} imports {name} from {node.module}")
    assert seen > 3  # the check sees the allowed ones
    assert offenders == []


def test_no_tool_imports_a_private_module():
    """tools/ is a user of fedsim and netem: it imports their public modules only."""
    offenders, seen = [], 0
    for path in sorted((ROOT / "tools").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                if name.split(".")[0] not in ("fedsim", "netem"):
                    continue
                seen += 1
                if _private_owner(name) is not None:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert seen > 20
    assert offenders == []


def _unit(module: str) -> str:
    """The package (``fedsim.wire``, ``netem``) or loose module (``fedsim.api``) of ``module``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "fedsim" and len(parts) > 1 else parts[0]


def test_the_packages_form_layers():
    """Between fedsim's packages and loose modules the imports have no cycle either.

    So they stack: the algorithms at the bottom, the wire and the scenario
    below the actors, the actors below launch, deploy, sweep and testing. The
    ``fedsim`` package itself is left out: it gathers the API's names on first use.
    """
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        if module == "fedsim":
            continue
        unit = _unit(module)
        graph.setdefault(unit, set()).update(
            _unit(e) for e in _edges(module, path) if e != "fedsim" and _unit(e) != unit)
    assert {"fedsim.wire", "fedsim.scenario", "fedsim.actors", "fedsim.launch"} <= set(graph)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
    assert "fedsim.actors" not in graph["fedsim.results"]  # results are read without the actors
    assert "fedsim.actors" not in graph["fedsim.wire"] | graph["fedsim.scenario"]


_LAZY = re.compile(r"#\s*lazy:\s*\S")


def _function_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The imports inside a function's body (a nested function's too), in ``tree``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                found.append(child)
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(tree, False)
    return found


def _comments(source: str) -> dict[int, str]:
    """Each line's comment (tokenized: a ``#`` inside a string is no comment)."""
    return {tok.start[0]: tok.string
            for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}


def test_every_import_inside_a_function_says_why_it_is_lazy():
    """An import sits at the top of its module unless it must wait; then it says why.

    A function-level import carries ``# lazy: <reason>`` on its (first)
    line: torch, matplotlib or a slow package kept out of a process that
    must not pay for it (client hosts, ``fedsim --help``), or an order a
    process must keep (the zygote listens before torch loads). One without
    a reason belongs at the top of its module.
    """
    offenders, lazy = [], 0
    for path in sorted(MODULES.values()):
        source = path.read_text()
        comments = _comments(source)
        for node in _function_imports(ast.parse(source, str(path))):
            if _LAZY.search(comments.get(node.lineno, "")):
                lazy += 1
            else:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: "
                                 f"{ast.unparse(node)}")
    assert offenders == [], ("imports inside functions with no `# lazy: <reason>` "
                             "comment (move them to the top of the module, or say why "
                             "they wait):\n  " + "\n  ".join(offenders))
    assert lazy > 10  # the walk sees the imports that stay lazy
