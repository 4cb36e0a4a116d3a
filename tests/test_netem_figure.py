"""tools/netem_figure.py: the README's network figure, drawn from netem's link model.

A few messages per profile (the real figure draws 2,000), to a temporary PNG.
The check that matters is a property of the model, not of the drawing: the
median delivery time of a 57 KB message is never below the profile's
configured one-way delay, although the propagation delay alone can be (the
Wi-Fi profile's paretonormal jitter has its median below its centre): the
serialisation at the rate and TCP's slow start after idle are always added.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tool_module import load_tool

from netem.profiles import profile

fig = load_tool("netem_figure")


def test_figure_drawn_and_medians_exceed_the_configured_delay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "img" / "netem-profiles.png"
    table = fig.run(out, samples=40)
    printed = capsys.readouterr().out

    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(table) == set(fig.NAMES)
    for name, directions in table.items():
        links = profile(name)
        assert name in printed
        for direction, (p50, p95) in directions.items():
            params = links.down if direction == "down" else links.up
            assert p50 >= params.delay, (name, direction, p50, params.delay)
            # and the least a message can take on the link: propagation floor + serialisation
            assert p50 >= params.least_delay(fig.MODEL_BYTES), (name, direction)
            assert p95 >= p50


def test_messages_start_from_idle() -> None:
    """The spacing the docstring documents: every message restarts slow start."""
    for name in ("satellite-geo", "wifi-floor"):
        s = fig.sample(name, "down", 30)
        assert s.warm == 0
        assert s.slow_start > 0.0
