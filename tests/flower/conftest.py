"""The Flower bridge's tests (marker ``flower``): they need the ``flower`` extra,
which the ``test`` extra installs. On a user's machine without Flower they skip
and say so; under ``CI=true`` a missing Flower is an error, not a quiet pass."""

from __future__ import annotations

import importlib.util
import os

if os.environ.get("CI") == "true" and importlib.util.find_spec("flwr") is None:
    raise RuntimeError("CI=true and Flower is not installed: the flower tier must run "
                       "(pip install -e '.[test]' installs it)")
