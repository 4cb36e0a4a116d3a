"""Run code in a fresh interpreter: what a process imports, seen from outside pytest's."""

from __future__ import annotations

import subprocess
import sys


def fresh_python(code: str) -> list[str]:
    """The words ``code`` prints, run by a new Python (this one's) with fedsim importable."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    return out.stdout.split()
