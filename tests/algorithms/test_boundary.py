"""fedsim.algorithms stays sans-I/O (STYLE.md practice 1, the package's Rules).

torch itself imports ``asyncio`` (torch.utils._traceback -> unittest.mock ->
asyncio, torch 2.13), so "asyncio absent from sys.modules" cannot hold for
any package that uses torch. The checks are therefore:

* ``zmq`` and ``netem`` are absent from ``sys.modules`` after a fresh import;
* importing ``fedsim.algorithms`` after torch adds no ``asyncio`` module, and
  no ``fedsim`` module executes an ``import`` of asyncio, zmq or netem
  (recorded through ``builtins.__import__``), whether or not it is loaded;
* only ``fedsim`` and ``fedsim.algorithms.*`` are loaded from fedsim;
* statically, no module in the package imports an I/O or clock module or
  reaches for global random state.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import fedsim.algorithms

FORBIDDEN = ("asyncio", "zmq", "netem")

PROBE = r"""
import builtins, json, sys
import torch  # the one heavy dependency; it brings asyncio with it
before = set(sys.modules)
seen = []
real_import = builtins.__import__
def spy(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__", "")
    if importer.startswith("fedsim") and level == 0:
        seen.append([importer, name])
    return real_import(name, globals, locals, fromlist, level)
builtins.__import__ = spy
import fedsim.algorithms
builtins.__import__ = real_import
after = set(sys.modules)
print(json.dumps({
    "all": sorted(after),
    "added": sorted(after - before),
    "imports": seen,
}))
"""


def _top(name: str) -> str:
    return name.split(".")[0]


def _probe() -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_pulls_in_no_io_modules():
    probe = _probe()
    loaded = probe["all"]
    assert [m for m in loaded if _top(m) in ("zmq", "netem")] == []
    assert [m for m in probe["added"] if _top(m) in FORBIDDEN] == []
    bad_imports = [
        (who, what) for who, what in probe["imports"] if _top(what) in FORBIDDEN
    ]
    assert bad_imports == []
    fedsim_modules = [m for m in loaded if _top(m) == "fedsim"]
    assert "fedsim.algorithms" in fedsim_modules
    assert [
        m
        for m in fedsim_modules
        if m != "fedsim" and not m.startswith("fedsim.algorithms")
    ] == []


PACKAGE = Path(fedsim.algorithms.__file__).parent
BANNED_MODULES = {"asyncio", "zmq", "netem", "time", "socket", "selectors", "threading"}


def _sources() -> list[Path]:
    files = sorted(PACKAGE.glob("*.py"))
    assert files
    return files


def test_no_module_imports_io_or_clock():
    offenders = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [(path.name, n) for n in names if _top(n) in BANNED_MODULES]
    assert offenders == []


def test_no_global_random_state():
    """Practice 11: owned generators only (random.Random(seed), torch.Generator)."""
    offenders = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not isinstance(
                node.func, ast.Attribute
            ):
                continue
            target = ast.unparse(node.func)
            if (
                target in {"torch.manual_seed", "torch.seed", "random.seed"}
                or (target.startswith("random.") and target != "random.Random")
                or target.startswith(("np.random.", "numpy.random."))
            ):
                offenders.append((path.name, node.lineno, target))
    assert offenders == []
