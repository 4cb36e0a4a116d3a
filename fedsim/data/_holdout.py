"""Held-out test sets for naturally partitioned data (Synthetic, LEAF).

Two recipes:

- ``per_user`` (the FedProx generator's and LEAF's): shuffle each user's
  examples, keep the first ``int((1 - f) n)`` for training and the rest for
  testing; the global test set is the union of the users' test parts.
- ``global`` (AsyncFedED's "10 % of the whole dataset"): pool all examples,
  draw ``round(f N)`` of them without replacement as the test set, and leave
  the rest with their users.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["HOLDOUTS", "holdout_global", "holdout_per_user"]

HOLDOUTS = ("per_user", "global")

Split = tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]


def _concat(parts: Sequence[np.ndarray], like: np.ndarray) -> np.ndarray:
    if parts:
        return np.concatenate(parts, axis=0)
    return np.empty((0, *like.shape[1:]), dtype=like.dtype)


def holdout_per_user(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray],
    test_fraction: float,
    rng: np.random.Generator,
) -> Split:
    """Split every user after a per-user shuffle (FedProx ``generate_synthetic.py``).

    Parameters
    ----------
    xs, ys : sequence of numpy.ndarray
        Per-user features and labels.
    test_fraction : float
        Fraction in (0, 1); user ``k`` keeps ``int((1 - f) n_k)`` examples.
    rng : numpy.random.Generator
        Source of the per-user shuffles (one ``permutation`` per user).

    Returns
    -------
    tuple
        ``(train_xs, train_ys, test_x, test_y)``.
    """
    train_xs: list[np.ndarray] = []
    train_ys: list[np.ndarray] = []
    test_x: list[np.ndarray] = []
    test_y: list[np.ndarray] = []
    for x, y in zip(xs, ys, strict=True):
        n = int(y.shape[0])
        perm = rng.permutation(n)
        cut = int((1.0 - test_fraction) * n)
        train_xs.append(x[perm[:cut]])
        train_ys.append(y[perm[:cut]])
        test_x.append(x[perm[cut:]])
        test_y.append(y[perm[cut:]])
    return train_xs, train_ys, _concat(test_x, xs[0]), _concat(test_y, ys[0])


def holdout_global(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray],
    test_fraction: float,
    rng: np.random.Generator,
) -> Split:
    """Sample ``round(f N)`` examples of the pooled data as the test set (AsyncFedED).

    Parameters
    ----------
    xs, ys : sequence of numpy.ndarray
        Per-user features and labels.
    test_fraction : float
        Fraction in (0, 1) of all examples to hold out.
    rng : numpy.random.Generator
        Source of the draw (one ``choice`` without replacement).

    Returns
    -------
    tuple
        ``(train_xs, train_ys, test_x, test_y)``; the test set is ordered
        by user, then by position within the user.
    """
    sizes = np.array([int(y.shape[0]) for y in ys], dtype=np.int64)
    total = int(sizes.sum())
    k = round(test_fraction * total)
    chosen = np.zeros(total, dtype=bool)
    chosen[rng.choice(total, size=k, replace=False)] = True
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    train_xs: list[np.ndarray] = []
    train_ys: list[np.ndarray] = []
    test_x: list[np.ndarray] = []
    test_y: list[np.ndarray] = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        mask = chosen[bounds[i] : bounds[i + 1]]
        train_xs.append(x[~mask])
        train_ys.append(y[~mask])
        test_x.append(x[mask])
        test_y.append(y[mask])
    return train_xs, train_ys, _concat(test_x, xs[0]), _concat(test_y, ys[0])
