"""What the test apps' ServerApps report to the tests: JSON lines in the file the run
config's ``log`` names (a ServerApp runs in a process of its own, so a module global
of the app is not the test's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write(context: Any, **entry: Any) -> None:
    """Append ``entry`` to the log the run config names (nothing when it names none)."""
    path = context.run_config.get("log")
    if path:
        with open(str(path), "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def read(path: str | Path) -> list[dict[str, Any]]:
    """Every entry written so far."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line]
