"""fedsim.algorithms stays sans-I/O (the package's Rules; docs/architecture.md#the-three-layers).

Every module of the package is checked, found with
:func:`pkgutil.walk_packages` (subpackages such as ``dga`` included), so a new
module is covered without editing this file.

torch itself imports ``asyncio`` (torch.utils._traceback -> unittest.mock ->
asyncio, torch 2.13), and with it ``socket``, ``selectors`` and
``threading``, so "absent from sys.modules" cannot hold for those in any
package that uses torch. The checks are therefore:

* in a fresh interpreter that has imported torch, importing every module of
  the package loads no ``zmq`` or ``netem`` module and no new ``asyncio``
  module, and no fedsim module executes an ``import`` of asyncio, zmq,
  netem, time, socket, selectors or threading (recorded through
  ``builtins.__import__``, so an import of an already loaded module counts);
* the only fedsim modules loaded are ``fedsim``, ``fedsim.algorithms.*``,
  ``fedsim.schema`` (the pydantic base model of the configs; pydantic
  itself is allowed), ``fedsim.lazy`` (torch bound on first use, so the
  client hosts that parse the configs never import it) and the wire's
  schema (``fedsim.wire.messages`` and the records, tensors and errors it
  is made of: a task and an update are its records), never its codec or
  transport;
* statically, no module names a forbidden or non-allowed fedsim module in
  any import statement (module level, under ``TYPE_CHECKING`` or inside a
  function), and none reaches for global random state.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import fedsim.algorithms

PACKAGE = "fedsim.algorithms"
FORBIDDEN = ("asyncio", "zmq", "netem", "time", "socket", "selectors", "threading")
ABSENT = ("zmq", "netem")  # not even loaded
ALLOWED_FEDSIM = ("fedsim", "fedsim.schema", "fedsim.lazy",  # besides fedsim.algorithms.*
                  # the wire's schema: a task and an update are its records (no codec,
                  # no transport: nothing that sends or receives)
                  "fedsim.wire", "fedsim.wire.messages", "fedsim.wire.records",
                  "fedsim.wire.tensors", "fedsim.wire.errors")


def _modules() -> dict[str, Path]:
    """Every module of fedsim.algorithms, the package itself included."""
    found = {PACKAGE: Path(fedsim.algorithms.__file__)}
    for info in pkgutil.walk_packages(fedsim.algorithms.__path__, prefix=f"{PACKAGE}."):
        spec = importlib.util.find_spec(info.name)
        assert spec is not None, info.name
        assert spec.origin is not None, info.name
        found[info.name] = Path(spec.origin)
    return found


MODULES = _modules()


def _top(name: str) -> str:
    return name.split(".")[0]


def _fedsim_allowed(name: str) -> bool:
    return name in ALLOWED_FEDSIM or name == PACKAGE or name.startswith(f"{PACKAGE}.")


PROBE = r"""
import builtins, importlib, importlib.util, json, pkgutil, sys
import torch  # the one heavy dependency; it brings asyncio with it
before = set(sys.modules)
seen = []
real_import = builtins.__import__
def spy(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__", "") or ""
    if importer.split(".")[0] == "fedsim":
        target = name
        if level:
            package = (globals or {}).get("__package__") or importer.rpartition(".")[0]
            target = importlib.util.resolve_name("." * level + name, package)
        seen.append([importer, target])
        for item in fromlist or ():
            seen.append([importer, target + "." + item])
    return real_import(name, globals, locals, fromlist, level)
builtins.__import__ = spy
import fedsim.algorithms
walked = ["fedsim.algorithms"]
for info in pkgutil.walk_packages(fedsim.algorithms.__path__, prefix="fedsim.algorithms."):
    importlib.import_module(info.name)
    walked.append(info.name)
builtins.__import__ = real_import
after = set(sys.modules)
print(json.dumps({
    "walked": walked,
    "all": sorted(after),
    "added": sorted(after - before),
    "imports": seen,
}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_walk_covers_subpackages() -> None:
    assert "fedsim.algorithms.dga" in MODULES
    assert any(m.startswith("fedsim.algorithms.dga.") for m in MODULES)


def test_probe_imports_every_module(probe: dict) -> None:
    assert sorted(probe["walked"]) == sorted(MODULES)
    assert set(MODULES) <= set(probe["all"])


def test_import_pulls_in_no_io_modules(probe: dict) -> None:
    assert [m for m in probe["all"] if _top(m) in ABSENT] == []
    assert [m for m in probe["added"] if _top(m) in ("asyncio", *ABSENT)] == []
    bad_imports = sorted({(who, what) for who, what in probe["imports"] if _top(what) in FORBIDDEN})
    assert bad_imports == []


def test_only_allowed_fedsim_modules_are_loaded(probe: dict) -> None:
    loaded = [m for m in probe["all"] if _top(m) == "fedsim"]
    assert [m for m in loaded if not _fedsim_allowed(m)] == []


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def imported_modules(module: str, path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every module named by an import anywhere in ``path``."""
    out: list[tuple[int, str]] = []
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node, is_package)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.append((node.lineno, sub if _is_module(sub) else source))
    return out


def test_no_module_imports_io_clock_or_other_fedsim_modules() -> None:
    offenders = [
        (name, line, what)
        for name, path in MODULES.items()
        for line, what in imported_modules(name, path)
        if _top(what) in FORBIDDEN or (_top(what) == "fedsim" and not _fedsim_allowed(what))
    ]
    assert offenders == []


# Owned generators are fine; everything else in these namespaces draws from
# (or reseeds) process-wide state.
OWNED_RNG = {
    "random.Random",
    "random.SystemRandom",
    "np.random.default_rng",
    "np.random.Generator",
    "np.random.SeedSequence",
    "np.random.PCG64",
    "np.random.Philox",
    "numpy.random.default_rng",
    "numpy.random.Generator",
    "numpy.random.SeedSequence",
    "numpy.random.PCG64",
    "numpy.random.Philox",
    "torch.Generator",
    "torch.random.fork_rng",  # forks and restores the global state around a block
}
GLOBAL_SEEDING = {
    "torch.manual_seed",
    "torch.seed",
    "torch.initial_seed",
    "torch.set_rng_state",
    "torch.random.manual_seed",
    "torch.random.seed",
    "torch.random.set_rng_state",
    "torch.cuda.manual_seed",
    "torch.cuda.manual_seed_all",
    "torch.cuda.set_rng_state",
}
# torch samplers that use the global generator unless given generator=
TORCH_SAMPLERS = {
    "rand",
    "randn",
    "randint",
    "randperm",
    "rand_like",
    "randn_like",
    "randint_like",
    "normal",
    "bernoulli",
    "multinomial",
    "poisson",
}
TENSOR_SAMPLERS = {
    "uniform_",
    "normal_",
    "bernoulli_",
    "random_",
    "exponential_",
    "geometric_",
    "cauchy_",
    "log_normal_",
}


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _forked(tree: ast.Module) -> set[int]:
    """Nodes inside ``with torch.random.fork_rng(...):``, where setting the
    global state (to replay one, e.g. the same dropout masks twice) is undone
    when the block ends."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With | ast.AsyncWith) and any(
            isinstance(item.context_expr, ast.Call)
            and _dotted(item.context_expr.func) == "torch.random.fork_rng"
            for item in node.items
        ):
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


def _global_rng_uses(tree: ast.Module) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    forked = _forked(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("random", "numpy.random"):
            prefix = "random." if node.module == "random" else "numpy.random."
            found += [
                (node.lineno, f"from {node.module} import {a.name}")
                for a in node.names
                if prefix + a.name not in OWNED_RNG
            ]
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        target = _dotted(node.func)
        if target is None:  # a call on a computed object, e.g. random.Random(1).random()
            if node.func.attr in TENSOR_SAMPLERS and not any(
                k.arg == "generator" for k in node.keywords
            ):
                found.append((node.lineno, ast.unparse(node.func)))
            continue
        has_generator = any(k.arg == "generator" for k in node.keywords)
        if target in OWNED_RNG or (target in GLOBAL_SEEDING and id(node) in forked):
            continue
        if (
            target in GLOBAL_SEEDING
            or target.startswith(("random.", "np.random.", "numpy.random."))
            or (
                target.startswith("torch.")
                and node.func.attr in TORCH_SAMPLERS
                and not has_generator
            )
            or (node.func.attr in TENSOR_SAMPLERS and not has_generator)
        ):
            found.append((node.lineno, target))
    return sorted(found)


def test_no_global_random_state() -> None:
    """Practice 11: owned generators only (random.Random(seed), torch.Generator)."""
    offenders = [
        (name, line, target)
        for name, path in MODULES.items()
        for line, target in _global_rng_uses(ast.parse(path.read_text(), str(path)))
    ]
    assert offenders == []


def test_the_random_state_scan_catches_what_it_should() -> None:
    code = """
import random
from random import shuffle
from numpy.random import default_rng
random.random()
random.Random(1).random()
np.random.rand(3)
np.random.default_rng(0)
torch.manual_seed(0)
torch.randn(3)
torch.randn(3, generator=g)
torch.random.fork_rng()
with torch.random.fork_rng():
    torch.set_rng_state(saved)
torch.set_rng_state(saved)
w.normal_(0, 1)
w.normal_(0, 1, generator=g)
"""
    found = [target for _, target in _global_rng_uses(ast.parse(code))]
    assert found == [
        "from random import shuffle",
        "random.random",
        "np.random.rand",
        "torch.manual_seed",
        "torch.randn",
        "torch.set_rng_state",
        "w.normal_",
    ]
