"""The deployment tier: real namespaces (and a real Slurm when present).

On a user's machine a test that cannot run here (not root, no `ip`, no
Slurm) skips and says exactly why. Under ``CI=true`` such a skip is a
failure: CI must run this tier, not quietly pass it.
"""

from __future__ import annotations

import os

import pytest

CI_REQUIRED = ("netns", "slurm")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if (os.environ.get("CI") == "true" and report.skipped
            and any(item.get_closest_marker(m) for m in CI_REQUIRED)):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true (this tier must run in CI): {reason}"
