"""Loading a Flower app's ServerApp or ClientApp from its ``module:attribute`` reference."""

from __future__ import annotations

import importlib
from typing import TypeVar

__all__ = ["AppError", "load"]

A = TypeVar("A")


class AppError(ValueError):
    """A reference that does not name the app it should (the message says what it found)."""


def load(reference: str, kind: type[A]) -> A:
    """The object ``reference`` (``module:attribute``) names, checked to be a ``kind``.

    The module is found as the scenario loader located it
    (:func:`fedsim.scenario.plugins.locate`: installed, on ``PYTHONPATH``, or next
    to the scenario file, which fedsim puts on its processes' path)."""
    module, _, attr = reference.partition(":")
    try:
        obj: object = importlib.import_module(module)
    except Exception as exc:
        raise AppError(f"{reference!r}: importing {module} failed: "
                       f"{type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppError(f"{reference!r}: module {module} has no attribute {attr!r}") from None
    if not isinstance(obj, kind):
        raise AppError(f"{reference!r} is a {type(obj).__name__}, not a {kind.__module__}."
                       f"{kind.__qualname__}")
    return obj
