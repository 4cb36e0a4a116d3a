"""tools/deployment_figure.py: the schematic of a federation across machines.

Drawn to a temporary PNG: the file is a PNG of the documented size (900 x 420
pixels) and of a plausible weight, and no text of the drawing overlaps
another, crosses an arrow, spills out of its box or leaves the canvas.
"""

from __future__ import annotations

import struct
from pathlib import Path

from tool_module import load_tool

fig = load_tool("deployment_figure")


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
