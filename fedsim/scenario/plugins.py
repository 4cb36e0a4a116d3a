"""Plug-ins: an algorithm, a model or a dataset from the user's own module.

A scenario names a plug-in where it names a built-in:

* ``algorithm.name = "mylab.rules:NORMTRIM"``: a ``module:attribute``
  reference to an :class:`~fedsim.algorithms.api.AlgorithmSpec`. Its
  ``[algorithm]`` keys are validated by the spec's own config model;
* ``model.name = "mylab.nets:TinyNet"``: a callable
  ``factory(input_shape, num_classes, **model.options) -> torch.nn.Module``;
* ``data.dataset = "mylab.data:blobs"``: a callable
  ``loader(num_clients=..., seed=..., **data.options)`` returning a
  :class:`~fedsim.data.FederatedData` (with ``partition = "natural"``) or
  the arrays ``(x_train, y_train, x_test, y_test)`` that fedsim partitions
  (``iid``, ``dirichlet``, ``shards``).

A name without a colon that is not built in is looked up among the entry
points of an installed distribution, in the groups ``fedsim.algorithms``,
``fedsim.models`` and ``fedsim.datasets``
(``[project.entry-points."fedsim.algorithms"] normtrim = "mylab.rules:NORMTRIM"``).

Where a plug-in module is found: on ``sys.path`` as usual (installed, on
``PYTHONPATH``, the current directory), and otherwise next to the scenario
file that names it (:func:`searching`). The processes fedsim starts (client
hosts, torch workers) rebuild everything from the scenario, so they import
the plug-in too: fedsim passes them the directories it imported plug-ins
from (:func:`child_env`). On other machines (``fedsim clients``) the module
must be found the same way there.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import site
import sys
import sysconfig
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from fedsim.errors import PluginError
from fedsim.scenario.explain import closest

__all__ = [
    "GROUPS",
    "check_options",
    "child_env",
    "dataset",
    "entry_point_names",
    "import_roots",
    "is_reference",
    "locate",
    "model",
    "resolve",
    "searching",
    "unknown",
]

#: Entry-point group of each kind of plug-in.
GROUPS = {"algorithm": "fedsim.algorithms", "model": "fedsim.models",
          "dataset": "fedsim.datasets"}

_cache: dict[tuple[str, str], Any] = {}
_search: list[Path] = []     # scenario directories, while a scenario is loaded
_roots: dict[str, None] = {}  # directories plug-ins were imported from (ordered set)


def is_reference(name: str) -> bool:
    """Whether ``name`` is a ``module:attribute`` reference."""
    return ":" in name


@contextlib.contextmanager
def searching(directory: str | Path) -> Iterator[None]:
    """Look for plug-in modules in ``directory`` too (after ``sys.path``) while inside."""
    _search.append(Path(directory).resolve())
    try:
        yield
    finally:
        _search.pop()


def entry_point_names(kind: str) -> list[str]:
    """Names installed distributions declare in ``kind``'s entry-point group."""
    return sorted({ep.name for ep in metadata.entry_points(group=GROUPS[kind])})


def unknown(kind: str, name: str, builtin: tuple[str, ...]) -> ValueError:
    """The error for a ``kind`` name that is neither built in nor a plug-in."""
    installed = entry_point_names(kind)
    names = ", ".join(repr(n) for n in (*builtin, *installed))
    guess = closest(name, (*builtin, *installed))
    hint = f"; did you mean {guess!r}?" if guess is not None else ""
    return ValueError(f"unknown {kind} {name!r} (allowed: {names}, or a plug-in "
                      f"'module:attribute'){hint}")


def resolve(kind: str, name: str, builtin: tuple[str, ...] = ()) -> Any:
    """The object a plug-in name stands for (cached; ValueError naming what is wrong).

    ``name`` is a ``module:attribute`` reference or an entry point of
    ``kind``'s group; ``builtin`` lists the built-in names for the error.
    """
    key = (kind, name)
    if key in _cache:
        return _cache[key]
    if is_reference(name):
        module, _, attr = name.partition(":")
        if not module or not attr:
            raise PluginError(f"{name!r} is not a plug-in reference: write "
                              "'module:attribute' (e.g. 'mylab.rules:SPEC')")
        obj: Any = _import(module, name)
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise PluginError(
                    f"{name!r}: module {module} has no attribute {attr!r}") from None
    else:
        found = [ep for ep in metadata.entry_points(group=GROUPS[kind]) if ep.name == name]
        if not found:
            raise unknown(kind, name, builtin)
        ep = found[0]
        try:
            obj = ep.load()
        except Exception as exc:
            raise PluginError(f"{kind} {name!r} (entry point {ep.value} of "
                              f"{GROUPS[kind]}): {type(exc).__name__}: {exc}") from None
        _note_root(ep.module)
    _cache[key] = obj
    return obj


def _import(module: str, name: str) -> ModuleType:
    """Import ``module`` from ``sys.path``, else from a scenario directory."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name is None or exc.name.split(".")[0] != top:
            raise PluginError(f"{name!r}: importing {module} failed: {exc}") from None
        home = next((d for d in reversed(_search)
                     if (d / top).is_dir() or (d / f"{top}.py").is_file()), None)
        if home is not None and str(home) in sys.path:  # it is there, and still fails
            raise PluginError(f"{name!r}: importing {module} failed: {exc}") from None
        if home is None:
            where = f", nor next to the scenario in {_search[-1]}" if _search else ""
            raise PluginError(
                f"{name!r}: no module named {exc.name!r} on the Python path{where} "
                "(install it, put its directory on PYTHONPATH, or place it next to the "
                "scenario file)") from None
        sys.path.append(str(home))
        importlib.invalidate_caches()
        return _import(module, name)
    except Exception as exc:
        raise PluginError(f"{name!r}: importing {module} failed: "
                          f"{type(exc).__name__}: {exc}") from None
    _note_root(module)
    return mod


def locate(reference: str) -> None:
    """Make the module of a ``module:attribute`` reference importable here and in the
    processes fedsim starts (:func:`child_env`), without importing it.

    A Flower app's module imports torch and Flower, which the processes that
    read a scenario (a client host's) must not load; the run's own
    processes import it later. Found as :func:`resolve` finds a plug-in: on
    ``sys.path``, else next to the scenario file. :class:`PluginError` when
    it is in neither.
    """
    module = reference.partition(":")[0]
    top = module.split(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    if found is not None:
        where = found.origin if found.origin not in (None, "namespace") else next(
            iter(found.submodule_search_locations or []), None)
        if where is None:
            return
        path = Path(where).resolve()
        root = path.parent.parent if path.name == "__init__.py" else path.parent
    else:
        home = next((d for d in reversed(_search)
                     if (d / top).is_dir() or (d / f"{top}.py").is_file()), None)
        if home is None:
            where_else = f", nor next to the scenario in {_search[-1]}" if _search else ""
            raise PluginError(
                f"{reference!r}: no module named {top!r} on the Python path{where_else} "
                "(install it, put its directory on PYTHONPATH, or place it next to the "
                "scenario file)")
        if str(home) not in sys.path:
            sys.path.append(str(home))
            importlib.invalidate_caches()
        root = home
    if os.path.realpath(root) not in _system_dirs():
        _roots[str(root)] = None


def _system_dirs() -> set[str]:
    dirs = {*site.getsitepackages(), site.getusersitepackages()}
    dirs.update(p for k in ("stdlib", "platstdlib", "purelib", "platlib")
                if (p := sysconfig.get_paths().get(k)))
    return {os.path.realpath(d) for d in dirs}


def _note_root(module: str) -> None:
    """Remember the directory ``module``'s top-level package was imported from."""
    top = sys.modules.get(module.split(".")[0])
    if top is None:
        return
    if getattr(top, "__file__", None):
        path = Path(str(top.__file__)).resolve()
        root = path.parent.parent if path.name == "__init__.py" else path.parent
    elif getattr(top, "__path__", None):  # a namespace package
        root = Path(next(iter(top.__path__))).resolve().parent
    else:
        return
    if os.path.realpath(root) not in _system_dirs():
        _roots[str(root)] = None


def import_roots() -> tuple[str, ...]:
    """Directories plug-in modules were imported from (not the installed ones)."""
    return tuple(_roots)


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The environment for a process fedsim starts: ``PYTHONPATH`` led by
    :func:`import_roots` (None, meaning "inherit", when there are none)."""
    if not _roots:
        return None
    base = dict(os.environ if env is None else env)
    old = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    base["PYTHONPATH"] = os.pathsep.join([*(r for r in _roots if r not in old), *old])
    return base


def _params(obj: Callable[..., Any]) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return None  # no signature to read: the call will tell


def _check_call(what: str, obj: Callable[..., Any], fixed: tuple[str, ...],
                positional: int) -> None:
    """PluginError unless ``obj`` takes ``positional`` arguments and ``fixed`` keywords."""
    params = _params(obj)
    if params is None:
        return
    kinds = {p.kind for p in params}
    by_position = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    by_name = {p.name for p in params[positional:]
               if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if (by_position < positional and inspect.Parameter.VAR_POSITIONAL not in kinds) or (
            inspect.Parameter.VAR_KEYWORD not in kinds and not set(fixed) <= by_name):
        need = ", ".join([*["input_shape", "num_classes"][:positional], *fixed])
        raise PluginError(f"{what} must accept {need} (see fedsim.scenario.plugins)")


def check_options(what: str, obj: Callable[..., Any], options: Mapping[str, Any],
                  fixed: tuple[str, ...], positional: int) -> None:
    """ValueError unless ``obj`` takes ``options`` as keywords.

    fedsim passes the first ``positional`` arguments by position and those
    named in ``fixed`` by keyword; the other parameters are the plug-in's
    options (all of them, when it takes ``**kwargs``).
    """
    params = _params(obj)
    if params is None:
        return
    named = {p.name: p for p in params[positional:]
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in fixed}
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        for k in options:
            if k not in named:
                guess = closest(k, named)
                hint = f"; did you mean {guess!r}?" if guess else ""
                raise ValueError(f"{k!r} is not an option of {what} (its options: "
                                 f"{', '.join(named) or 'none'}){hint}")
    missing = [n for n, p in named.items() if p.default is p.empty and n not in options]
    if missing:
        raise ValueError(f"{what} needs {', '.join(missing)} (set it in options)")


def model(name: str, builtin: tuple[str, ...] = ()) -> Callable[..., Any]:
    """The factory ``model.name`` names (ValueError if it is none)."""
    obj = resolve("model", name, builtin)
    if not callable(obj):
        raise PluginError(f"{name!r} is a {type(obj).__name__}, not a model factory "
                          "(a callable: factory(input_shape, num_classes, **options))")
    _check_call(f"model {name!r}", obj, fixed=(), positional=2)
    return obj  # type: ignore[no-any-return]


def dataset(name: str, builtin: tuple[str, ...] = ()) -> Callable[..., Any]:
    """The loader ``data.dataset`` names (ValueError if it is none)."""
    obj = resolve("dataset", name, builtin)
    if not callable(obj):
        raise PluginError(f"{name!r} is a {type(obj).__name__}, not a dataset loader "
                          "(a callable: loader(num_clients=..., seed=..., **options))")
    _check_call(f"dataset {name!r}", obj, fixed=("num_clients", "seed"), positional=0)
    return obj  # type: ignore[no-any-return]
