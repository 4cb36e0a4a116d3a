"""``federate``: what a plug-in dataset's loader returns, as a run's federated dataset.

A plug-in loader (:mod:`fedsim.scenario.plugins`) either splits its data among the
clients itself (a :class:`FederatedData`, ``partition = "natural"``) or
returns pooled arrays, which the partitions of :func:`build_federated` split
here, with the same seeded streams.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedsim.data._build import (
    _PARTITION_OPTIONS,
    _REQUIRED,
    PARTITIONS,
    _assemble,
    _partition,
)
from fedsim.data._common import check_choice, check_int, check_seed
from fedsim.data._types import FederatedData

__all__ = ["federate"]


def federate(
    name: str,
    data: Any,
    *,
    num_clients: int,
    partition: str,
    seed: int,
    **options: Any,
) -> FederatedData:
    """What a plug-in dataset's loader returned, as the federated dataset of a run.

    Parameters
    ----------
    name : str
        The plug-in's name (``data.dataset``), recorded in the result.
    data : FederatedData or tuple
        A :class:`FederatedData` of ``num_clients`` clients (``partition``
        must be ``"natural"``), or the arrays ``(x_train, y_train, x_test,
        y_test)`` (features float, labels int 0..C-1), which are split among
        the clients by ``partition`` (``iid``, ``dirichlet``, ``shards``)
        with the partition options of :func:`build_federated`.
    num_clients, seed
        As for :func:`build_federated`.

    Raises
    ------
    ValueError
        When ``data`` is neither, or does not fit ``partition`` or ``num_clients``.
    """
    partition = check_choice("partition", partition, PARTITIONS)
    num_clients = check_int("num_clients", num_clients, 1)
    seed = check_seed(seed)
    if isinstance(data, FederatedData):
        if partition != "natural":
            raise ValueError(f"Invalid partition: {partition!r} for dataset {name!r}, whose "
                             "loader returns clients already (allowed: natural)")
        if data.num_clients != num_clients:
            raise ValueError(f"Invalid dataset {name!r}: its loader returned "
                             f"{data.num_clients} clients for num_clients = {num_clients}")
        return data
    if not (isinstance(data, tuple | list) and len(data) == 4):
        raise ValueError(f"Invalid dataset {name!r}: its loader returned "
                         f"{type(data).__name__}, not a FederatedData or "
                         "(x_train, y_train, x_test, y_test)")
    if partition == "natural":
        raise ValueError(f"Invalid partition: 'natural' for dataset {name!r}, whose loader "
                         "returns pooled arrays (allowed: iid, dirichlet, shards)")
    x_tr, x_te = (np.asarray(x, dtype=np.float32) for x in (data[0], data[2]))
    y_tr, y_te = (np.asarray(y).astype(np.int64) for y in (data[1], data[3]))
    for what, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        if y.ndim != 1 or x.ndim < 2 or x.shape[0] != y.shape[0] or not y.size:
            raise ValueError(f"Invalid dataset {name!r}: {what} arrays of shapes {x.shape} "
                             f"and {y.shape} (want (n, ...) features and n labels, n > 0)")
        if y.min() < 0:
            raise ValueError(f"Invalid dataset {name!r}: negative {what} label {y.min()}")
    opts = _resolve_partition(name, partition, options)
    num_classes = int(max(y_tr.max(), y_te.max())) + 1
    parts = _partition(partition, y_tr, num_clients, opts, seed, num_classes)
    ids = tuple(f"c{i:04d}" for i in range(num_clients))
    meta: dict[str, Any] = {
        "plugin": name,
        "partition_options": {k: opts[k] for k in _PARTITION_OPTIONS[partition]},
    }
    return _assemble(name, partition, ids, [x_tr[p] for p in parts],
                     [y_tr[p] for p in parts], x_te, y_te, num_classes, meta, seed)


def _resolve_partition(name: str, partition: str, options: Mapping[str, Any]) -> dict[str, Any]:
    allowed = _PARTITION_OPTIONS[partition]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"Unknown option(s) {unknown} for partition {partition!r} "
                         f"(allowed: {', '.join(sorted(allowed)) or 'none'})")
    resolved = {**allowed, **options}
    missing = sorted(k for k, v in resolved.items() if v is _REQUIRED)
    if missing:
        raise ValueError(f"Missing option(s) {missing} for dataset {name!r} with partition "
                         f"{partition!r}")
    return resolved
