r"""Partitioners: pure functions from a label array to per-client index arrays.

Every function takes the labels, the number of clients and an explicit
``numpy.random.Generator``, and returns a list of int64 index arrays (one per
client, indices into ``labels``). None of them touches global random state.

Recipes (docs/algorithms.md#partitions):

``partition_iid``
    Uniform random equal split.
``partition_dirichlet(recipe="hsu")``
    Hsu et al. 2019 (https://arxiv.org/abs/1909.06335), row-wise:
    :math:`q_i \sim \mathrm{Dir}(\alpha p)`; client :math:`i`'s :math:`n_i`
    labels are drawn from :math:`\mathrm{Cat}(q_i)`, each taking one unused
    example of that class; when a class runs out, :math:`q_i` is
    renormalized over the classes that remain
    (docs/algorithms.md#dirichlet-class-exhaustion).
``partition_dirichlet(recipe="deltasgd_code")``
    Delta-SGD authors' ``dirichlet_sampler_idsize``: counts
    ``round(n q_ij)``, the last class gets ``max(n - sum, 0)``, examples
    drawn *with* replacement, independently per client.
``partition_dirichlet(recipe="feddyn_sequential")``
    FedSpeed's FL-Simulator / FedDyn ``DatasetObject``: equal
    :math:`n_i`; examples are assigned one at a time to a uniformly random
    unfinished client, the class drawn from :math:`q_i`; an exhausted class
    pool is refilled (examples are reused) and the class redrawn.
``partition_shards``
    McMahan et al. 2017 (https://arxiv.org/abs/1602.05629) shards: sort
    by label, cut ``k N`` equal shards, give each client ``k`` random shards;
    optionally make each client's ``k`` shard classes distinct.

The Dirichlet prior: ``prior="uniform"`` gives :math:`\alpha p = \alpha \mathbf 1`,
which is what both authors' codes draw (``np.random.dirichlet(alpha * ones)``);
``prior="empirical"`` scales the all-ones vector by the class frequencies
(:math:`\alpha C f_j`), so it equals the uniform prior on balanced data.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from fedsim.data._common import (
    check_choice,
    check_int,
    check_labels,
    check_nonneg_float,
)

__all__ = [
    "DIRICHLET_PRIORS",
    "DIRICHLET_RECIPES",
    "partition_dirichlet",
    "partition_iid",
    "partition_shards",
]

DIRICHLET_RECIPES = ("hsu", "deltasgd_code", "feddyn_sequential")
DIRICHLET_PRIORS = ("uniform", "empirical")


def _check_common(labels: Any, num_clients: Any, rng: Any) -> tuple[np.ndarray, int]:
    y = check_labels(labels)
    m = check_int("num_clients", num_clients, 1)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"Invalid rng: {rng!r} (must be a numpy.random.Generator)")
    if y.shape[0] < m:
        raise ValueError(
            f"Invalid num_clients: {m} clients need at least {m} examples, "
            f"got {y.shape[0]}"
        )
    return y, m


def _class_pools(
    y: np.ndarray, num_classes: int, order: np.ndarray
) -> list[np.ndarray]:
    """Indices of each class, in the order given by ``order`` (a permutation)."""
    ordered = y[order]
    return [order[ordered == c] for c in range(num_classes)]


def partition_iid(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    samples_per_client: int | None = None,
) -> list[np.ndarray]:
    """Uniform random equal split.

    Parameters
    ----------
    labels : numpy.ndarray
        1-D integer labels (only the length is used).
    num_clients : int
        Number of clients.
    rng : numpy.random.Generator
        Source of the permutation.
    samples_per_client : int, optional
        Give every client exactly this many examples (the rest are unused).
        By default all examples are dealt out and sizes differ by at most 1.

    Returns
    -------
    list of numpy.ndarray
        int64 indices per client.
    """
    y, m = _check_common(labels, num_clients, rng)
    perm = rng.permutation(y.shape[0]).astype(np.int64)
    if samples_per_client is None:
        return list(np.array_split(perm, m))
    n = check_int("samples_per_client", samples_per_client, 1)
    if n * m > y.shape[0]:
        raise ValueError(
            f"Invalid samples_per_client: {n} x {m} clients exceeds the "
            f"{y.shape[0]} examples"
        )
    return list(perm[: n * m].reshape(m, n))


def _hsu(
    y: np.ndarray, q: np.ndarray, sizes: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    num_classes = q.shape[1]
    pools = _class_pools(y, num_classes, rng.permutation(y.shape[0]))
    avail = np.array([p.shape[0] for p in pools], dtype=np.int64)
    used = np.zeros(num_classes, dtype=np.int64)
    out: list[np.ndarray] = []
    for i, n_i in enumerate(sizes):
        # Categorical draws with rejection of exhausted classes, done in
        # batches: the first draws of a class up to its supply are accepted,
        # the excess is redrawn from q_i renormalized over the classes left.
        counts = np.zeros(num_classes, dtype=np.int64)
        need = int(n_i)
        while need > 0:
            room = avail - used - counts
            weights = np.where(room > 0, q[i], 0.0)
            if weights.sum() <= 0.0:  # q_i has no mass left: fall back to supply
                weights = room.clip(min=0).astype(np.float64)
            draws = rng.multinomial(need, weights / weights.sum())
            take = np.minimum(draws, room.clip(min=0))
            counts += take
            need -= int(take.sum())
        parts = [pools[c][used[c] : used[c] + counts[c]] for c in range(num_classes)]
        used += counts
        out.append(rng.permutation(np.concatenate(parts)).astype(np.int64))
    return out


def _deltasgd_code(
    y: np.ndarray, q: np.ndarray, sizes: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    num_classes = q.shape[1]
    pools = [np.flatnonzero(y == c) for c in range(num_classes)]
    out: list[np.ndarray] = []
    for i, n_i in enumerate(sizes):
        counts = np.round(int(n_i) * q[i]).astype(np.int64)
        counts[-1] = max(int(n_i) - int(counts[:-1].sum()), 0)
        parts = []
        for c in range(num_classes):
            if counts[c] and not pools[c].size:
                raise ValueError(
                    f"Invalid labels for recipe 'deltasgd_code': class {c} has no "
                    f"examples but client {i} needs {counts[c]}"
                )
            parts.append(rng.choice(pools[c], size=int(counts[c]), replace=True))
        out.append(np.concatenate(parts).astype(np.int64))
    return out


def _feddyn_sequential(
    y: np.ndarray, q: np.ndarray, sizes: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    num_classes = q.shape[1]
    pools = _class_pools(y, num_classes, rng.permutation(y.shape[0]))
    full = [int(p.shape[0]) for p in pools]
    left = list(full)
    # A class with no examples at all can never be refilled: move its mass
    # to the classes present (uniformly if a row has none), so redraws end.
    present = np.array(full) > 0
    q = np.where(present, q, 0.0)
    q[q.sum(axis=1) <= 0.0] = present.astype(np.float64)
    q = q / q.sum(axis=1, keepdims=True)
    cum = [list(np.cumsum(row)) for row in q]
    for row in cum:
        row[-1] = 1.0  # argmax(u <= cumsum) must always hit a class
    remaining = [int(s) for s in sizes]
    out = [np.empty(int(s), dtype=np.int64) for s in sizes]
    open_clients = [i for i in range(len(sizes)) if remaining[i] > 0]
    total = int(sum(remaining))
    u_client = rng.random(total)
    u_class = rng.random(total)
    for t in range(total):
        slot = int(u_client[t] * len(open_clients))
        client = open_clients[slot]
        remaining[client] -= 1
        if remaining[client] == 0:  # swap-remove keeps the draw O(1)
            open_clients[slot] = open_clients[-1]
            open_clients.pop()
        u = float(u_class[t])
        while True:
            c = min(bisect.bisect_left(cum[client], u), num_classes - 1)
            if left[c] > 0:
                break
            if full[c] > 0:
                left[c] = full[c]  # refill the exhausted pool, then redraw
            u = float(rng.random())
        left[c] -= 1
        out[client][remaining[client]] = pools[c][left[c]]
    return out


def partition_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    *,
    recipe: str = "hsu",
    samples_per_client: int | None = None,
    num_classes: int | None = None,
    prior: str = "uniform",
) -> list[np.ndarray]:
    """Row-wise Dirichlet label skew: client ``i`` draws ``q_i ~ Dir(alpha p)``.

    Parameters
    ----------
    labels : numpy.ndarray
        1-D integer labels.
    num_clients : int
        Number of clients.
    alpha : float
        Dirichlet concentration (> 0); smaller is more skewed.
    rng : numpy.random.Generator
        Source of every draw (``q`` for all clients first, then samples).
    recipe : {"hsu", "deltasgd_code", "feddyn_sequential"}
        See the module docstring.
    samples_per_client : int, optional
        ``n_i`` for every client. Default ``N // num_clients``; for
        ``feddyn_sequential`` the first client also gets the remainder, as in
        the authors' code, so all ``N`` examples are dealt out.
    num_classes : int, optional
        Number of classes ``C``; default ``max(labels) + 1``.
    prior : {"uniform", "empirical"}
        Class prior ``p`` (see the module docstring).

    Returns
    -------
    list of numpy.ndarray
        int64 indices per client. ``deltasgd_code`` may repeat indices and
        give a client more than ``n_i`` examples (its rounding quirk).
    """
    y, m = _check_common(labels, num_clients, rng)
    a = check_nonneg_float("dirichlet_alpha", alpha, positive=True)
    recipe = check_choice("recipe", recipe, DIRICHLET_RECIPES)
    prior = check_choice("prior", prior, DIRICHLET_PRIORS)
    big_n = int(y.shape[0])
    c_min = int(y.max()) + 1
    c = c_min if num_classes is None else check_int("num_classes", num_classes, c_min)
    if samples_per_client is None:
        sizes = np.full(m, big_n // m, dtype=np.int64)
        if recipe == "feddyn_sequential":
            sizes[0] += big_n - int(sizes.sum())
    else:
        n = check_int("samples_per_client", samples_per_client, 1)
        if recipe != "deltasgd_code" and n * m > big_n:
            raise ValueError(
                f"Invalid samples_per_client: {n} x {m} clients exceeds the {big_n} "
                f"examples (recipe {recipe!r} samples without replacement)"
            )
        sizes = np.full(m, n, dtype=np.int64)
    freq = np.bincount(y, minlength=c).astype(np.float64)
    if prior == "uniform":
        concentration = np.full(c, a)
    else:
        if np.any(freq == 0):
            raise ValueError(
                "Invalid prior: 'empirical' needs every class present; classes "
                f"{np.flatnonzero(freq == 0).tolist()} have no examples"
            )
        concentration = a * c * freq / freq.sum()
    q = rng.dirichlet(concentration, size=m)
    if recipe == "hsu":
        return _hsu(y, q, sizes, rng)
    if recipe == "deltasgd_code":
        return _deltasgd_code(y, q, sizes, rng)
    return _feddyn_sequential(y, q, sizes, rng)


def _fix_duplicates(
    assign: np.ndarray, shard_class: np.ndarray, rng: np.random.Generator
) -> None:
    """Swap shards until no client holds two shards of one class (in place)."""
    m, k = assign.shape
    while True:
        cls = shard_class[assign]
        bad = next((i for i in range(m) if np.unique(cls[i]).size < k), None)
        if bad is None:
            return
        row = cls[bad]
        s = next(j for j in range(1, k) if row[j] in row[:j])  # a duplicate slot
        dup, rest_i = row[s], np.delete(row, s)
        # A swap of (bad, s) with (j, t) is valid when bad gains a class it
        # lacks and client j does not already hold class `dup` elsewhere.
        ok = ~np.isin(cls, rest_i)
        for t in range(k):
            others = np.delete(cls, t, axis=1)
            ok[:, t] &= ~np.any(others == dup, axis=1)
        ok[bad, :] = False
        candidates = np.argwhere(ok)
        if candidates.shape[0] == 0:
            raise ValueError(
                f"Invalid shards_per_client: cannot give every client {k} distinct "
                "classes with these labels (too few classes or too much imbalance)"
            )
        j, t = candidates[int(rng.integers(candidates.shape[0]))]
        assign[bad, s], assign[j, t] = assign[j, t], assign[bad, s]


def partition_shards(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    shards_per_client: int = 2,
    distinct_classes: bool = True,
) -> list[np.ndarray]:
    """McMahan's shard recipe, ``k`` shards (about ``k`` classes) per client.

    Parameters
    ----------
    labels : numpy.ndarray
        1-D integer labels.
    num_clients : int
        Number of clients ``N``.
    rng : numpy.random.Generator
        Source of the within-class order and the shard assignment.
    shards_per_client : int
        ``k``; the examples sorted by label are cut into ``k N`` equal shards
        of ``len(labels) // (k N)`` examples (the remainder is unused).
    distinct_classes : bool
        Make the ``k`` shards of every client belong to ``k`` different
        classes (a shard's class is its majority label). A conflicting shard
        is re-drawn by swapping it with a uniformly chosen compatible shard
        of another client; redrawing the whole assignment until it is valid
        almost never succeeds for 100 clients.

    Returns
    -------
    list of numpy.ndarray
        int64 indices per client, ``k * shard_size`` each.
    """
    y, m = _check_common(labels, num_clients, rng)
    k = check_int("shards_per_client", shards_per_client, 1)
    if not isinstance(distinct_classes, bool | np.bool_):
        raise ValueError(f"Invalid distinct_classes: {distinct_classes!r} (True/False)")
    num_shards = k * m
    size = y.shape[0] // num_shards
    if size < 1:
        raise ValueError(
            f"Invalid shards_per_client: {k} x {m} clients = {num_shards} shards "
            f"for {y.shape[0]} examples"
        )
    perm = rng.permutation(y.shape[0])
    order = perm[np.argsort(y[perm], kind="stable")].astype(np.int64)
    shards = order[: num_shards * size].reshape(num_shards, size)
    c = int(y.max()) + 1
    shard_class = np.array([np.bincount(y[s], minlength=c).argmax() for s in shards])
    assign = rng.permutation(num_shards).reshape(m, k)
    if distinct_classes and k > 1:
        if np.unique(shard_class).size < k:
            raise ValueError(
                f"Invalid shards_per_client: {k} distinct classes wanted but the "
                f"shards cover only {np.unique(shard_class).size} classes"
            )
        _fix_duplicates(assign, shard_class, rng)
    return [np.concatenate([shards[s] for s in row]) for row in assign]
