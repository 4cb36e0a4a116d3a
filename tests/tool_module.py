"""A script of tools/ loaded as a module by its path, for the tests of its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_tool(script: str, name: str | None = None) -> ModuleType:
    """``tools/<script>.py`` as module ``name`` (default: the script's name), entered in
    ``sys.modules`` so that its dataclasses and pickling find it."""
    name = name or script
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{script}.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
