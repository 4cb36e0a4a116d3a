"""The values :func:`fedsim.data.build_federated` returns."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ClientShard", "FederatedData"]


def _check_xy(what: str, x: np.ndarray, y: np.ndarray) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise ValueError(f"Invalid {what} x: expected a float32 ndarray")
    if not isinstance(y, np.ndarray) or y.dtype != np.int64 or y.ndim != 1:
        raise ValueError(f"Invalid {what} y: expected a 1-D int64 ndarray")
    if x.ndim < 1 or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"Invalid {what}: x has shape {x.shape} but y has {y.shape[0]} labels"
        )


def _histogram(y: np.ndarray, num_classes: int) -> list[int]:
    return [int(c) for c in np.bincount(y, minlength=num_classes)[:num_classes]]


@dataclass(frozen=True, slots=True, eq=False)
class ClientShard:
    """One client's training data.

    Attributes
    ----------
    client_id : str
        A stable name: the LEAF/Synthetic user name (``f_00007``) for natural
        partitions, ``c0007`` otherwise.
    x : numpy.ndarray
        float32 features, shape ``(n, *input_shape)``. Character data
        (Shakespeare) holds vocabulary indices stored as float32.
    y : numpy.ndarray
        int64 labels, shape ``(n,)``.

    The arrays are shared, not copied: treat them as read-only.
    """

    client_id: str
    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        _check_xy(f"shard {self.client_id!r}", self.x, self.y)

    @property
    def num_samples(self) -> int:
        """Number of training examples."""
        return int(self.y.shape[0])

    def label_histogram(self, num_classes: int) -> list[int]:
        """Per-class example counts, length ``num_classes``."""
        return _histogram(self.y, num_classes)


@dataclass(frozen=True, slots=True, eq=False)
class FederatedData:
    """A federated dataset: client shards plus a held-out global test set.

    Attributes
    ----------
    name : str
        Dataset name given to :func:`build_federated`.
    partition : str
        Partition recipe (``natural``, ``iid``, ``dirichlet``, ``shards``).
    clients : tuple of ClientShard
        One shard per client, in client-index order.
    test_x, test_y : numpy.ndarray
        The global test set (float32 features, int64 labels).
    num_classes : int
        Number of output classes.
    input_shape : tuple of int
        Shape of one example (``x.shape[1:]``).
    meta : Mapping
        JSON-able facts about how the data were made (generator parameters,
        realized per-user sizes, file names), copied into :meth:`stats`.
    """

    name: str
    partition: str
    clients: tuple[ClientShard, ...]
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.clients:
            raise ValueError("Invalid federated data: no clients")
        _check_xy("test set", self.test_x, self.test_y)
        for shard in (*self.clients, None):
            x = self.test_x if shard is None else shard.x
            if tuple(x.shape[1:]) != tuple(self.input_shape):
                raise ValueError(
                    f"Invalid federated data: example shape {x.shape[1:]} differs "
                    f"from input_shape {self.input_shape}"
                )
        # A private JSON-able copy: stats() can return it, pickle can send it.
        object.__setattr__(self, "meta", _jsonable(self.meta))

    @property
    def num_clients(self) -> int:
        """Number of client shards."""
        return len(self.clients)

    @property
    def num_train(self) -> int:
        """Total number of training examples over all clients."""
        return sum(c.num_samples for c in self.clients)

    def fingerprint(self) -> str:
        """SHA-256 over every array, shape, dtype and client id.

        Processes that rebuild the data independently (server, client hosts)
        can compare fingerprints to prove they hold identical shards.
        """
        h = hashlib.sha256()
        arrays = [(c.client_id, c.x, c.y) for c in self.clients]
        arrays.append(("test", self.test_x, self.test_y))
        for cid, x, y in arrays:
            h.update(cid.encode())
            for a in (x, y):
                h.update(f"{a.dtype.str}{a.shape}".encode())
                h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    def stats(self) -> dict[str, Any]:
        """A JSON-able summary for the run directory.

        Returns
        -------
        dict
            Dataset name, partition, shapes, per-client sample counts and
            label histograms, the test-set histogram, the fingerprint and
            ``meta``.
        """
        c = self.num_classes
        return {
            "dataset": self.name,
            "partition": self.partition,
            "num_clients": self.num_clients,
            "num_classes": c,
            "input_shape": list(self.input_shape),
            "num_train": self.num_train,
            "num_test": int(self.test_y.shape[0]),
            "fingerprint": self.fingerprint(),
            "clients": [
                {
                    "id": s.client_id,
                    "num_samples": s.num_samples,
                    "label_histogram": s.label_histogram(c),
                }
                for s in self.clients
            ],
            "test_label_histogram": _histogram(self.test_y, c),
            "meta": _jsonable(self.meta),
        }


def _jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays and mappings to plain JSON types."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value
