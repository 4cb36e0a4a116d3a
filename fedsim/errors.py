"""The errors fedsim raises to its callers, in one small hierarchy.

A library never exits: :func:`fedsim.load` and :func:`fedsim.run` raise
these, and the command line maps them to its exit codes (``fedsim.cli``):

======================  =============================================  ====
error                   raised when                                    exit
======================  =============================================  ====
:class:`ScenarioError`  a scenario cannot run (every bad key named)    2
:class:`OverrideError`  an override (``--set``, ``--dilation``,        2
                        ``overrides=``) is malformed or invalid
:class:`PluginError`    a plug-in (``module:attribute``, entry point)  2
                        cannot be found or is not what it must be
:class:`ResumeError`    a run directory cannot be continued            2
:class:`DeployError`    a deployment cannot start as asked             2
:class:`SweepError`    a sweep file or directory is malformed, or     2
                        ``--out`` holds a different sweep
:class:`RunDirError`    a directory is not a run, or of a format this  2
                        fedsim cannot read (``fedsim.results.reader``)
:class:`RunFailed`      a run ended ``failed`` or ``error``            3
:class:`RunInterrupted` a run was stopped (Ctrl-C, a cancelled task)   130
======================  =============================================  ====

Every one is a :class:`FedsimError`. The configuration errors are also
:class:`ValueError` (they were before this hierarchy existed), and a run's
errors carry the run's result (:attr:`RunFailed.result`): its directory and
summary are written whatever the outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "DeployError",
    "FedsimError",
    "FedsimWarning",
    "OverrideError",
    "PluginError",
    "ResumeError",
    "RunFailed",
    "RunInterrupted",
    "ScenarioError",
]


class FedsimError(Exception):
    """Base of every error fedsim raises on purpose."""


class FedsimWarning(UserWarning):
    """Something valid but probably not meant (a key the algorithm does not use)."""


class ScenarioError(FedsimError, ValueError):
    """A scenario that cannot run; the message names every bad key.

    Attributes
    ----------
    source
        Where the scenario came from (a file path, ``"scenario"`` for a mapping).
    problems
        One line per problem, ``key: what is wrong`` (what the message lists).
    """

    def __init__(self, message: str, *, source: str = "scenario",
                 problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.source = source
        self.problems = tuple(problems)


class OverrideError(ScenarioError):
    """An override is malformed, or the value it sets is not allowed.

    The scenario file is not to blame: the message says the override came
    from the command line (``--set``, ``--dilation``) or from the
    ``overrides=`` argument of :func:`fedsim.load`, and names the key.

    Attributes
    ----------
    keys
        The dotted keys of the offending overrides.
    origin
        ``"the command line"`` or ``"the overrides= argument"``.
    """

    def __init__(self, message: str, *, keys: Sequence[str], origin: str,
                 source: str = "scenario", problems: Sequence[str] = ()) -> None:
        super().__init__(message, source=source, problems=problems)
        self.keys = tuple(keys)
        self.origin = origin


class PluginError(ScenarioError):
    """A plug-in named by a scenario cannot be imported or is not what it must be."""


class ResumeError(FedsimError, ValueError):
    """A run directory cannot be continued (no checkpoint, another scenario or version)."""


class DeployError(FedsimError, ValueError):
    """A deployment that cannot start as asked; the message says what to do."""


class RunFailed(FedsimError):
    """A run ended ``failed: ...`` or ``error: ...``; :attr:`result` holds what it wrote.

    ``result`` is a :class:`fedsim.api.RunResult` (run directory, summary,
    metrics) for a run that started, or None when it failed before writing
    any (the cause is chained).
    """

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


class RunInterrupted(FedsimError):
    """A run was stopped before its end (Ctrl-C, a cancelled task); its results are kept.

    :attr:`result` is the :class:`fedsim.api.RunResult` of what the run did.
    """

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result
