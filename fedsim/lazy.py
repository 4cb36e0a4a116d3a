"""A module that is imported on first use: how the client-host path stays torch-free.

Only the processes that train, evaluate or aggregate import torch; a client
host relays messages and never does (docs/architecture.md#processes). Yet a
host parses the scenario, which imports every algorithm's home module, and
each home holds its client side, written against torch. Those modules bind
torch lazily::

    from typing import TYPE_CHECKING

    from fedsim.lazy import lazy_module

    if TYPE_CHECKING:
        import torch
    else:
        torch = lazy_module("torch")

mypy sees the real module, so every annotation keeps its real type; at run
time ``torch`` is a :class:`LazyModule` that imports torch on its first
attribute access (``torch.zeros``, ``torch.Tensor``). A module written so
must not touch torch while it is being imported: no ``torch.float64``
constant, ``@torch.no_grad()`` decorator or ``torch.optim.Optimizer`` base
class at module level (annotations are strings under ``from __future__ import
annotations`` and cost nothing). ``tests/test_torch_free.py`` holds the rule.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

__all__ = ["LazyModule", "is_loaded", "lazy_module"]


class LazyModule:
    """Stands for the module ``name`` until an attribute is read from it.

    The first read of a public attribute imports the module and makes this
    object's ``__dict__`` the module's own namespace, so every later read
    (and a write, such as a test's monkeypatch) is a plain dictionary lookup
    on the real module, with no proxy in between. Names that start with two
    underscores (``__wrapped__``, ``__file__``) are what introspection
    (``inspect``, ``doctest``, ``copy``, pytest) probes: before the import
    they raise ``AttributeError`` instead of importing the module.
    """

    __slots__ = ("__dict__", "_lazy_name")

    def __init__(self, name: str) -> None:
        self._lazy_name = name

    def __getattr__(self, attr: str) -> Any:
        # Called only when normal lookup fails: before the import, or for a
        # name the module lacks (then getattr raises the module's own error).
        if attr.startswith("__") and not is_loaded(self):
            raise AttributeError(
                f"{attr!r}: the lazy module {self._lazy_name!r} is not imported yet"
            )
        return getattr(_load(self), attr)

    def __repr__(self) -> str:
        state = "loaded" if is_loaded(self) else "not loaded"
        return f"<lazy module {self._lazy_name!r} ({state})>"


def lazy_module(name: str) -> LazyModule:
    """A stand-in for module ``name`` that imports it on first attribute access."""
    return LazyModule(name)


def is_loaded(proxy: LazyModule) -> bool:
    """Whether ``proxy`` has imported its module (an attribute was read from it)."""
    return "__name__" in object.__getattribute__(proxy, "__dict__")


def _load(proxy: LazyModule) -> types.ModuleType:
    """Import the proxy's module and share its namespace; return the module."""
    module = importlib.import_module(object.__getattribute__(proxy, "_lazy_name"))
    object.__setattr__(proxy, "__dict__", module.__dict__)
    return module
