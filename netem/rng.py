"""Seeded, independent random streams, one per (link, direction, purpose).

Seeded, independent streams per link and per purpose (delay, loss state,
loss draw, availability), so that the same seed yields the same loss and delay
sequence regardless of traffic volume (FlowEmu likewise keeps GE transitions
and loss draws on separate generators).

A stream is named by the scenario seed plus a tuple of string/int keys, e.g.
``stream(seed, "link", 7, "down", "delay")``. The keys are hashed with BLAKE2b
over a type-tagged encoding (never Python's per-process randomised ``hash()``),
and the digest becomes the ``spawn_key`` of a :class:`numpy.random.SeedSequence`
whose entropy is the seed. Two different key tuples give statistically
independent generators; the same tuple always gives the same one, whatever
other streams were created before or how much they were used.

No global random state is read or written anywhere in netem.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["key_digest", "seed_sequence", "stream"]

Key = str | int


def _encode(key: Key) -> bytes:
    # Type-tagged so that "1" and 1 differ; length-prefixed so that
    # ("ab", "c") and ("a", "bc") differ.
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise ValueError(f"stream key {key!r}: must be a str or an int")
    if isinstance(key, str):
        raw = key.encode("utf-8")
        return b"s" + len(raw).to_bytes(8, "little") + raw
    raw = str(key).encode("ascii")
    return b"i" + len(raw).to_bytes(8, "little") + raw


def key_digest(*keys: Key) -> tuple[int, ...]:
    """Stable 128-bit digest of ``keys`` as four uint32 words.

    Identical across processes, platforms and Python versions.
    """
    h = hashlib.blake2b(digest_size=16, person=b"fedsim-netem")
    for k in keys:
        h.update(_encode(k))
    d = h.digest()
    return tuple(int.from_bytes(d[i : i + 4], "little") for i in range(0, 16, 4))


def seed_sequence(seed: int, *keys: Key) -> np.random.SeedSequence:
    """The :class:`~numpy.random.SeedSequence` behind :func:`stream`."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed = {seed!r}: must be an int >= 0")
    return np.random.SeedSequence(entropy=seed, spawn_key=key_digest(*keys))


def stream(seed: int, *keys: Key) -> np.random.Generator:
    """An independent, reproducible PCG64 generator for ``(seed, *keys)``.

    Parameters
    ----------
    seed
        Scenario seed, an int >= 0.
    *keys
        Path naming the consumer, e.g. ``"link", client_id, "down", "delay"``.

    Examples
    --------
    >>> a = stream(1, "link", 3, "down", "delay").random()
    >>> b = stream(1, "link", 3, "down", "delay").random()
    >>> a == b
    True
    """
    return np.random.Generator(np.random.PCG64(seed_sequence(seed, *keys)))
