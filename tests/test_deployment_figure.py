"""tools/deployment_figure.py: the schematic of a federation across machines.

Drawn to a temporary PNG: the file is a PNG of the documented size (900 x 420
pixels) and of a plausible weight, and no text of the drawing overlaps
another, crosses an arrow, spills out of its box or leaves the canvas.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _tool() -> Any:
    """tools/deployment_figure.py, loaded by its path (it is a script)."""
    path = ROOT / "tools" / "deployment_figure.py"
    spec = importlib.util.spec_from_file_location("deployment_figure", path)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["deployment_figure"] = mod
    spec.loader.exec_module(mod)
    return mod


fig = _tool()


def test_figure_drawn(tmp_path: Path) -> None:
    out = tmp_path / "img" / "deployment.png"
    assert fig.draw(out) == out

    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (fig.WIDTH, fig.HEIGHT) == (900, 420)
    assert 20_000 < len(data) < 1_000_000


def test_no_text_overlaps() -> None:
    assert fig.text_overlaps(fig.figure()) == []
