"""What ``fedsim check`` writes beside a resolved scenario's keys.

A resolved scenario holds every key, also those the chosen optimizer,
algorithm, model, dataset or partition does not read (:func:`unused_keys`),
and those that replace the named network profile's values
(:func:`profile_replacements`); :func:`key_notes` is both, as comments for
:func:`fedsim.scenario.to_toml` (``fedsim check``, a run's ``scenario.toml``).
"""

from __future__ import annotations

from fedsim.scenario.file import Scenario
from fedsim.scenario.netconfig import LinkConfig
from fedsim.scenario.sections import optimizer_options
from netem.profiles import PROFILES

__all__ = ["key_notes", "profile_replacements", "unread_task_keys", "unused_keys"]


def unused_keys(scenario: Scenario) -> dict[str, str]:
    """Resolved keys the scenario's optimizer, algorithm or model does not read, and why.

    ``resolved`` fills every default in, so ``client.local_steps = 10``
    appears under DGA, whose clients take ``algorithm.local_steps`` per
    round: ``fedsim check`` marks such keys with these reasons. (An
    optimizer option a scenario file sets for another optimizer is refused
    by :func:`load`; the ones marked here were left at their defaults, or
    set for the file's own optimizer that an override replaced.)
    """
    out: dict[str, str] = {}
    reads, foreign = optimizer_options(scenario.client)
    for key in foreign:
        if getattr(scenario.client, key) is not None:
            out[f"client.{key}"] = (f"not used by optimizer {scenario.client.optimizer} (it "
                                    f"reads {', '.join(reads)})")
    own = scenario.algorithm.client_table()
    if own is not None:
        for key in sorted(type(scenario.client).model_fields):
            out[f"client.{key}"] = f"not used by {scenario.algorithm.name}: {own}"
        out.update(unread_task_keys(scenario.data.dataset, scenario.data.partition,
                                    scenario.model.name))
        return out
    work = scenario.algorithm.local_work()
    if work is not None:
        why = f"not used by {scenario.algorithm.name}: {work}"
        for key in ("local_steps", "local_epochs"):
            if getattr(scenario.client, key) is not None:
                out[f"client.{key}"] = why
    out.update(unread_task_keys(scenario.data.dataset, scenario.data.partition,
                                scenario.model.name))
    return out


def profile_replacements(scenario: Scenario) -> dict[str, str]:
    """The ``[network]`` keys set next to a named profile, each with the profile's value
    it replaces (``network.up.delay``: ``replaces profile satellite-geo's 0.3``).

    A key left out keeps the profile's value, one set replaces it: a scenario
    that sets its delays keeps them under ``--set network.profile=...``, and
    ``fedsim check`` says so next to each.
    """
    net = scenario.network
    if net.profile is None:
        return {}
    prof = PROFILES[net.profile]
    why = f"replaces profile {net.profile}'s"
    out: dict[str, str] = {}
    if net.rtt is not None:
        out["network.rtt"] = f"{why} {prof.rtt:g} (leave it out to take it)"
    for direction in ("up", "down"):
        link: LinkConfig = getattr(net, direction)
        rate = getattr(prof, direction)
        theirs: dict[str, object] = {
            "delay": f"{prof.rtt / 2:g}", "jitter": f"{prof.jitter:g}",
            "distribution": prof.distribution, "correlation": f"{prof.correlation:g}",
            "rate": "unlimited" if rate is None else f"{rate:g}",
            "loss": "loss model" if prof.loss is not None else None}
        for key, value in theirs.items():
            if value is not None and getattr(link, key) is not None:
                out[f"network.{direction}.{key}"] = f"{why} {value} (leave it out to take it)"
    return out


def key_notes(scenario: Scenario) -> dict[str, str]:
    """The comments ``fedsim check`` writes next to resolved keys: those nothing reads
    (:func:`unused_keys`) and those that replace the named profile's values
    (:func:`profile_replacements`)."""
    return {**profile_replacements(scenario), **unused_keys(scenario)}


def unread_task_keys(dataset: str, partition: str, model: str) -> dict[str, str]:
    """The ``model.*`` and ``data.*`` keys this model, dataset and partition do not read, and why.

    Plain names in, so that a run directory's ``scenario.json`` is read the
    same way (:func:`fedsim.results.compare.task_differences`).
    """
    out: dict[str, str] = {}
    reads = {"mlp": ("hidden",), "char_lstm": ("lstm_hidden",)}.get(model, ())
    for key in ("hidden", "lstm_hidden"):
        if key not in reads:
            out[f"model.{key}"] = f"not used by model {model}"
    for keys, used, why in (
            (("synthetic_alpha", "synthetic_beta", "synthetic_iid", "synthetic_sizes"),
             dataset == "synthetic",
             f"not used by dataset {dataset}"),
            (("dirichlet_alpha", "dirichlet_recipe"), partition == "dirichlet",
             f"not used by partition {partition}"),
            (("classes_per_client",), partition == "shards",
             f"not used by partition {partition}")):
        if not used:
            out.update({f"data.{k}": why for k in keys})
    return out
