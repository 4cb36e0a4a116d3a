"""The actor layer names no algorithm: it only calls the protocol of
:mod:`fedsim.algorithms.api` (one home per algorithm)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import fedsim.actors
from fedsim.algorithms import algorithm_names, get

CLASS_NAMES = {"FedAsync", "AsyncFedED", "FedBuff", "Scaffold", "FedSpeed", "DGA", "FedAvg",
               "FedProx", "FedOpt", "FedAdam", "FedYogi", "FedAdagrad", "FedAvgM", "DeltaSGD"}


def _actor_sources() -> list[Path]:
    out = [Path(fedsim.actors.__file__)]
    for info in pkgutil.walk_packages(fedsim.actors.__path__, "fedsim.actors."):
        module = importlib.import_module(info.name)
        out.append(Path(module.__file__))
    return out


def _forbidden() -> set[str]:
    words = set(CLASS_NAMES)
    for name in algorithm_names():
        spec = get(name)
        words.add(name)
        words.add(spec.config.__name__)
    return words


def test_actor_modules_name_no_algorithm():
    words = _forbidden()
    pattern = re.compile(
        r"(?<![A-Za-z])(" + "|".join(sorted(map(re.escape, words), key=len, reverse=True))
        + r")(?![a-z])", re.IGNORECASE)
    offenders = []
    sources = _actor_sources()
    assert len(sources) >= 5
    for path in sources:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for m in pattern.finditer(line):
                offenders.append(f"{path.name}:{lineno}: {m.group(0)!r} in {line.strip()!r}")
    assert offenders == []
