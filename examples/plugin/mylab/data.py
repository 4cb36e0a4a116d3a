"""A dataset for fedsim: ``data.dataset = "mylab.data:blobs"``.

fedsim calls ``blobs(num_clients=..., seed=..., **data.options)``. This one
returns pooled arrays, which fedsim splits among the clients by
``data.partition`` (``iid``, ``dirichlet``, ``shards``); a loader that
splits its data itself returns a :class:`fedsim.data.FederatedData` and
runs with ``partition = "natural"``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["blobs"]


def blobs(num_clients: int, seed: int, *, classes: int = 4, dim: int = 8,
          samples: int = 1200, spread: float = 1.5
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gaussian blobs: one centre per class in ``dim`` dimensions, 20 % held out.

    Everything comes from ``seed``, so every process gets the same arrays.
    """
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, spread, size=(classes, dim))
    y = rng.integers(0, classes, size=samples)
    x = (centres[y] + rng.normal(size=(samples, dim))).astype(np.float32)
    n_test = samples // 5
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]
