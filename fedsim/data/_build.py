"""``build_federated``: one call from ``(dataset, options, seed)`` to client shards.

The same arguments give identical shards in every process: each random
choice comes from ``make_rng(seed, stream)`` with a fixed stream per purpose
(generation, holdout, partition, user selection), and nothing depends on
hash randomization or on directory listing order (files are sorted).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fedsim.data._cifar import load_cifar10
from fedsim.data._common import (
    STREAM_HOLDOUT,
    STREAM_PARTITION,
    STREAM_SELECT,
    check_choice,
    check_fraction,
    check_int,
    check_nonneg_float,
    check_seed,
    make_rng,
)
from fedsim.data._digits import load_digits_arrays
from fedsim.data._holdout import HOLDOUTS, holdout_global, holdout_per_user
from fedsim.data._leaf import LEAF_VOCAB, load_leaf
from fedsim.data._mnist import load_mnist
from fedsim.data._partition import (
    partition_dirichlet,
    partition_iid,
    partition_shards,
)
from fedsim.data._synthetic import SYNTHETIC_CLASSES, generate_synthetic
from fedsim.data._types import ClientShard, FederatedData

__all__ = ["DATASETS", "PARTITIONS", "build_federated", "dataset_partitions", "path_problem"]

logger = logging.getLogger(__name__)

_REQUIRED = object()
NATURAL = ("synthetic", "leaf")
DATASETS = ("synthetic", "digits", "leaf", "mnist", "cifar10")
PARTITIONS = ("natural", "iid", "dirichlet", "shards")

_DATASET_OPTIONS: dict[str, dict[str, Any]] = {
    "synthetic": {
        "alpha": 1.0,
        "beta": 1.0,
        "iid": False,
        "n_cap": None,
        "n_equal": None,
        "holdout": "per_user",
        "test_fraction": 0.1,
    },
    "leaf": {
        "path": _REQUIRED,
        "test_path": None,
        "holdout": "per_user",
        "test_fraction": 0.1,
        "num_classes": None,
        "input_shape": None,
    },
    "digits": {"flatten": False, "test_fraction": 0.2},
    "mnist": {"path": _REQUIRED, "flatten": False},
    "cifar10": {"path": _REQUIRED, "flatten": False},
}
_PARTITION_OPTIONS: dict[str, dict[str, Any]] = {
    "natural": {},
    "iid": {"samples_per_client": None},
    "dirichlet": {
        "dirichlet_alpha": _REQUIRED,
        "recipe": "hsu",
        "samples_per_client": None,
        "prior": "uniform",
    },
    "shards": {"classes_per_client": 2, "distinct_classes": True},
}

#: what the loaders of the datasets that read files (a ``path`` option) need there:
#: a directory (or a file or directory, LEAF's JSON), and what it holds, in words
_PATHS: dict[str, tuple[bool, str]] = {
    "leaf": (False, "a LEAF .json file or a directory of them"),
    "mnist": (True, "a directory holding the four MNIST IDX files, or their raw/ directory"),
    "cifar10": (True, "a directory holding the CIFAR-10 python batches, or their "
                "cifar-10-batches-py directory"),
}

Arrays = tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]


def dataset_partitions(dataset: str) -> tuple[str, ...]:
    """The partitions a built-in ``dataset`` takes (:func:`build_federated` refuses the rest).

    ``natural`` for the datasets that come partitioned, a client per user
    (``synthetic``, ``leaf``); ``iid``, ``dirichlet`` or ``shards`` for the
    others, whose pooled examples fedsim splits among the clients.
    """
    dataset = check_choice("dataset", dataset, DATASETS)
    return ("natural",) if dataset in NATURAL else tuple(p for p in PARTITIONS
                                                         if p != "natural")


def path_problem(dataset: str, path: str | os.PathLike[str] | None) -> str | None:
    """What is wrong with ``path`` as a built-in ``dataset``'s ``path`` option, or None.

    Cheap, and reads no data: only whether the path is set (``leaf``,
    ``mnist`` and ``cifar10`` need one, the others read no files), exists,
    and is a directory where the loader needs one; a loader still names a
    file missing inside it. A relative path is relative to the current
    directory, where the loaders open it.
    """
    dataset = check_choice("dataset", dataset, DATASETS)
    if "path" not in _DATASET_OPTIONS[dataset]:
        if path is None:
            return None
        readers = ", ".join(_PATHS)
        return (f"set to {os.fspath(path)!r}, but dataset {dataset!r} reads no files "
                f"(path is for {readers})")
    directory, what = _PATHS[dataset]
    if path is None or not os.fspath(path):
        return f"not set, but dataset {dataset!r} reads its files from it ({what})"
    text = os.fspath(path)
    # a relative path with the absolute one it stands for here
    shown = repr(text) if os.path.isabs(text) else f"{text!r} ({os.path.abspath(text)})"
    if not os.path.exists(text):
        return f"{shown} does not exist (dataset {dataset!r} reads {what})"
    if directory and not os.path.isdir(text):
        return f"{shown} is not a directory (dataset {dataset!r} reads {what})"
    return None


def _resolve(
    dataset: str, partition: str, options: Mapping[str, Any]
) -> dict[str, Any]:
    allowed = {**_DATASET_OPTIONS[dataset], **_PARTITION_OPTIONS[partition]}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"Unknown option(s) {unknown} for dataset {dataset!r} with partition "
            f"{partition!r} (allowed: {', '.join(sorted(allowed)) or 'none'})"
        )
    resolved = {**allowed, **options}
    missing = sorted(k for k, v in resolved.items() if v is _REQUIRED)
    if missing:
        raise ValueError(
            f"Missing option(s) {missing} for dataset {dataset!r} with partition "
            f"{partition!r}"
        )
    return resolved


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"Invalid {name}: {value!r} (must be True or False)")
    return bool(value)


def _check_path(name: str, value: Any) -> str:
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise ValueError(
            f"Invalid {name}: {value!r} (must be a file or directory path)"
        )
    return os.fspath(value)


def _holdout(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray],
    opts: Mapping[str, Any],
    seed: int,
) -> Arrays:
    holdout = check_choice("holdout", opts["holdout"], HOLDOUTS)
    fraction = check_fraction("test_fraction", opts["test_fraction"])
    split = holdout_per_user if holdout == "per_user" else holdout_global
    return split(xs, ys, fraction, make_rng(seed, STREAM_HOLDOUT))


def _synthetic(
    num_clients: int, opts: dict[str, Any], seed: int, explicit: bool
) -> tuple[Any, ...]:
    data = generate_synthetic(
        num_clients,
        alpha=opts["alpha"],
        beta=opts["beta"],
        iid=_check_bool("iid", opts["iid"]),
        n_cap=opts["n_cap"],
        n_equal=opts["n_equal"],
        seed=seed,
    )
    train_xs, train_ys, test_x, test_y = _holdout(data.x, data.y, opts, seed)
    meta = {
        "generator": "fedprox_synthetic (litian96/FedProx generate_synthetic.py)",
        "alpha": float(opts["alpha"]),
        "beta": float(opts["beta"]),
        "iid": bool(opts["iid"]),
        "n_cap": opts["n_cap"],
        "n_equal": opts["n_equal"],
        "holdout": opts["holdout"],
        "test_fraction": float(opts["test_fraction"]),
        "n_k": list(data.num_samples),
        "n_k_uncapped": list(data.num_samples_uncapped),
    }
    return data.users, train_xs, train_ys, test_x, test_y, SYNTHETIC_CLASSES, meta


def _leaf(
    num_clients: int, opts: dict[str, Any], seed: int, explicit: bool
) -> tuple[Any, ...]:
    """Load LEAF users; ``explicit`` says holdout options were given by the caller."""
    data = load_leaf(_check_path("path", opts["path"]))
    total = len(data.users)
    if num_clients > total:
        raise ValueError(
            f"Invalid num_clients: {num_clients} (the LEAF data at {opts['path']} "
            f"has {total} users)"
        )
    picked = np.arange(total)
    if num_clients < total:  # a seeded subset, kept in file order
        picked = np.sort(
            make_rng(seed, STREAM_SELECT).choice(total, num_clients, False)
        )
    users = tuple(data.users[i] for i in picked)
    xs = [data.x[i] for i in picked]
    ys = [data.y[i] for i in picked]
    meta: dict[str, Any] = {"files": list(data.files), "users_available": total}
    if opts["test_path"] is not None:
        if explicit:
            raise ValueError(
                "Invalid options: holdout/test_fraction cannot be combined with "
                "test_path (the test files are the test set)"
            )
        test = load_leaf(_check_path("test_path", opts["test_path"]))
        if test.is_text != data.is_text:
            raise ValueError("Invalid test_path: its feature kind differs from path's")
        wanted = set(users)
        keep = [i for i, u in enumerate(test.users) if u in wanted]
        test_x = np.concatenate([test.x[i] for i in keep]) if keep else xs[0][:0]
        test_y = np.concatenate([test.y[i] for i in keep]) if keep else ys[0][:0]
        train_xs, train_ys = xs, ys
        meta["test_files"] = list(test.files)
    else:
        train_xs, train_ys, test_x, test_y = _holdout(xs, ys, opts, seed)
        meta.update(holdout=opts["holdout"], test_fraction=float(opts["test_fraction"]))
    if data.is_text:
        num_classes = len(LEAF_VOCAB)
    else:
        top = max(int(y.max()) for y in (*ys, test_y) if y.size) + 1
        num_classes = (
            top
            if opts["num_classes"] is None
            else check_int("num_classes", opts["num_classes"], top)
        )
    shape = opts["input_shape"]
    if shape is not None:
        if not isinstance(shape, list | tuple) or not shape:
            raise ValueError(f"Invalid input_shape: {shape!r} (a list of ints)")
        shape = tuple(check_int("input_shape entry", s, 1) for s in shape)
        if int(np.prod(shape)) != int(np.prod(xs[0].shape[1:])):
            raise ValueError(
                f"Invalid input_shape: {shape} does not hold {xs[0].shape[1:]} features"
            )
        train_xs = [x.reshape(-1, *shape) for x in train_xs]
        test_x = test_x.reshape(-1, *shape)
    meta["text"] = data.is_text
    return users, train_xs, train_ys, test_x, test_y, num_classes, meta


def _pooled(dataset: str, opts: dict[str, Any], seed: int) -> tuple[Any, ...]:
    """Load a dataset that is partitioned by us: train/test arrays in [0, 1]."""
    if dataset == "digits":
        x, y = load_digits_arrays(flatten=_check_bool("flatten", opts["flatten"]))
        fraction = check_fraction("test_fraction", opts["test_fraction"])
        perm = make_rng(seed, STREAM_HOLDOUT).permutation(y.shape[0])
        n_test = round(fraction * y.shape[0])
        test, train = perm[:n_test], perm[n_test:]
        meta = {"source": "sklearn.datasets.load_digits", "test_fraction": fraction}
        return x[train], y[train], x[test], y[test], 10, meta
    flatten = _check_bool("flatten", opts["flatten"])
    path = _check_path("path", opts["path"])
    loader: Callable[[str], tuple[np.ndarray, ...]] = (
        load_mnist if dataset == "mnist" else load_cifar10
    )
    x_tr, y_tr, x_te, y_te = loader(path)
    top = int(max(y_tr.max(initial=0), y_te.max(initial=0)))
    if top > 9:
        raise ValueError(f"Invalid {dataset} labels under {path}: class {top} > 9")
    if dataset == "mnist":
        x_tr, x_te = x_tr[:, None], x_te[:, None]
    x_tr = x_tr.astype(np.float32) / np.float32(255.0)
    x_te = x_te.astype(np.float32) / np.float32(255.0)
    if flatten:
        x_tr, x_te = x_tr.reshape(x_tr.shape[0], -1), x_te.reshape(x_te.shape[0], -1)
    return x_tr, y_tr, x_te, y_te, 10, {"path": path}


def _partition(
    partition: str,
    y: np.ndarray,
    num_clients: int,
    opts: Mapping[str, Any],
    seed: int,
    num_classes: int = 10,
) -> list[np.ndarray]:
    rng = make_rng(seed, STREAM_PARTITION)
    if partition == "iid":
        return partition_iid(
            y, num_clients, rng, samples_per_client=opts["samples_per_client"]
        )
    if partition == "dirichlet":
        return partition_dirichlet(
            y,
            num_clients,
            check_nonneg_float(
                "dirichlet_alpha", opts["dirichlet_alpha"], positive=True
            ),
            rng,
            recipe=opts["recipe"],
            samples_per_client=opts["samples_per_client"],
            prior=opts["prior"],
            num_classes=num_classes,
        )
    return partition_shards(
        y,
        num_clients,
        rng,
        shards_per_client=opts["classes_per_client"],
        distinct_classes=opts["distinct_classes"],
    )


def build_federated(
    dataset: str,
    *,
    num_clients: int,
    partition: str,
    seed: int,
    **options: Any,
) -> FederatedData:
    """Build a federated dataset, deterministically from its arguments.

    Parameters
    ----------
    dataset : {"synthetic", "digits", "leaf", "mnist", "cifar10"}
        ``synthetic``: FedProx Synthetic(alpha, beta), one client per user
        (options ``alpha=1.0``, ``beta=1.0``, ``iid=False``, ``n_cap=None``,
        ``n_equal=None``: every user that many examples,
        ``holdout="per_user"``, ``test_fraction=0.1``).
        ``leaf``: LEAF JSON at ``path`` (file or directory), one client per
        user, a seeded subset when ``num_clients`` is smaller (options
        ``test_path``, ``holdout``, ``test_fraction``, ``num_classes``,
        ``input_shape``, e.g. ``(1, 28, 28)`` for FEMNIST).
        ``digits``: scikit-learn's bundled 8x8 digits (``flatten=False``,
        ``test_fraction=0.2``). ``mnist``/``cifar10``: IDX files or python
        batches at ``path`` (``flatten=False``); their own test split.
    num_clients : int
        Number of clients (users for natural data).
    partition : {"natural", "iid", "dirichlet", "shards"}
        ``natural`` for ``synthetic`` and ``leaf``, which come partitioned;
        one of the others for the rest: ``iid`` (``samples_per_client``),
        ``dirichlet`` (``dirichlet_alpha``, ``recipe="hsu"``,
        ``samples_per_client``, ``prior="uniform"``), ``shards``
        (``classes_per_client=2``: McMahan shards, that many per client;
        ``distinct_classes=True``).
    seed : int
        Seed of every random choice (>= 0).
    **options
        Dataset and partition options named above; anything else is an error.

    Returns
    -------
    FederatedData
        Client shards, the global test set and metadata.

    Raises
    ------
    ValueError
        For an unknown dataset, partition or option, or a bad value.
    FileNotFoundError
        When a loader's files are missing.
    """
    dataset = check_choice("dataset", dataset, DATASETS)
    partition = check_choice("partition", partition, PARTITIONS)
    num_clients = check_int("num_clients", num_clients, 1)
    seed = check_seed(seed)
    allowed = dataset_partitions(dataset)
    if partition not in allowed:
        raise ValueError(
            f"Invalid partition: {partition!r} for dataset {dataset!r} "
            f"(allowed: {', '.join(allowed)})"
        )
    opts = _resolve(dataset, partition, options)
    if dataset in NATURAL:
        explicit = bool({"holdout", "test_fraction"} & set(options))
        make = _synthetic if dataset == "synthetic" else _leaf
        ids, xs, ys, test_x, test_y, num_classes, meta = make(
            num_clients, opts, seed, explicit
        )
    else:
        x_tr, y_tr, test_x, test_y, num_classes, meta = _pooled(dataset, opts, seed)
        parts = _partition(partition, y_tr, num_clients, opts, seed, num_classes)
        ids = tuple(f"c{i:04d}" for i in range(num_clients))
        xs, ys = [x_tr[p] for p in parts], [y_tr[p] for p in parts]
        meta["partition_options"] = {k: opts[k] for k in _PARTITION_OPTIONS[partition]}
    return _assemble(dataset, partition, ids, xs, ys, test_x, test_y, num_classes, meta, seed)


def _assemble(
    name: str,
    partition: str,
    ids: Sequence[str],
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray],
    test_x: np.ndarray,
    test_y: np.ndarray,
    num_classes: int,
    meta: dict[str, Any],
    seed: int,
) -> FederatedData:
    empty = [cid for cid, y in zip(ids, ys, strict=True) if y.shape[0] == 0]
    if empty:
        raise ValueError(
            f"Invalid options: clients {empty[:5]} have no training examples "
            "(lower test_fraction or use holdout='per_user')"
        )
    meta["seed"] = seed
    clients = tuple(
        ClientShard(cid, np.ascontiguousarray(x), np.ascontiguousarray(y))
        for cid, x, y in zip(ids, xs, ys, strict=True)
    )
    fed = FederatedData(
        name=name,
        partition=partition,
        clients=clients,
        test_x=np.ascontiguousarray(test_x),
        test_y=np.ascontiguousarray(test_y),
        num_classes=int(num_classes),
        input_shape=tuple(int(s) for s in clients[0].x.shape[1:]),
        meta=meta,
    )
    logger.info(
        "built %s/%s: %d clients, %d train, %d test examples",
        name,
        partition,
        fed.num_clients,
        fed.num_train,
        test_y.shape[0],
    )
    return fed

