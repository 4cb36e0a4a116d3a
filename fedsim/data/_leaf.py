"""LEAF JSON loader (Caldas et al., https://arxiv.org/abs/1812.01097).

A LEAF file is a JSON object::

    {"users": [u, ...], "num_samples": [n_u, ...],
     "user_data": {u: {"x": [...], "y": [...]}, ...}}

(optionally with ``hierarchies``, which is ignored). A LEAF split is usually a
directory of such files (``data/train/*.json``); every ``.json`` file in it is
read, in file-name order, and users keep the order in which they appear.

Feature formats:

- numeric: ``x`` is a list of equal-length number lists (Synthetic, FEMNIST),
  ``y`` a list of integer class ids (they may be written as floats, ``7.0``);
- characters: ``x`` is a list of equal-length strings and ``y`` a list of
  single characters (Shakespeare). Both are mapped to indices in LEAF's
  80-character vocabulary (``models/utils/language_utils.py``,
  ``ALL_LETTERS``); a character outside it is an error, where LEAF would
  silently produce -1.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["LEAF_VOCAB", "LeafData", "chars_to_indices", "load_leaf"]

logger = logging.getLogger(__name__)

LEAF_VOCAB = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
_CHAR_INDEX = {ch: i for i, ch in enumerate(LEAF_VOCAB)}


@dataclass(frozen=True, slots=True, eq=False)
class LeafData:
    """Per-user arrays read from LEAF JSON.

    Attributes
    ----------
    users : tuple of str
        User names in file order.
    x : tuple of numpy.ndarray
        float32 features per user, ``(n_u, *feature_shape)``; for character
        data, vocabulary indices stored as float32, ``(n_u, seq_len)``.
    y : tuple of numpy.ndarray
        int64 labels per user.
    is_text : bool
        Whether ``x`` and ``y`` were character data.
    files : tuple of str
        The file names read, in order.
    """

    users: tuple[str, ...]
    x: tuple[np.ndarray, ...]
    y: tuple[np.ndarray, ...]
    is_text: bool
    files: tuple[str, ...]

    @property
    def num_samples(self) -> tuple[int, ...]:
        """Number of examples per user."""
        return tuple(int(y.shape[0]) for y in self.y)


def chars_to_indices(text: str) -> np.ndarray:
    """Map a string to int64 indices in LEAF's 80-character vocabulary.

    Raises
    ------
    ValueError
        If ``text`` holds a character outside :data:`LEAF_VOCAB`.
    """
    try:
        return np.array([_CHAR_INDEX[ch] for ch in text], dtype=np.int64)
    except KeyError as exc:
        raise ValueError(
            f"Invalid character {exc.args[0]!r}: not in LEAF's 80-character vocabulary"
        ) from None


def _leaf_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".json" and p.is_file())
        if not files:
            raise FileNotFoundError(f"No .json files in LEAF directory {path}")
        return files
    raise FileNotFoundError(f"LEAF path {path} is neither a file nor a directory")


def _user_arrays(
    user: str, record: Any, where: str
) -> tuple[np.ndarray, np.ndarray, bool]:
    if not isinstance(record, dict) or "x" not in record or "y" not in record:
        raise ValueError(
            f"Invalid LEAF data for user {user!r} in {where}: need x and y"
        )
    xs, ys = record["x"], record["y"]
    if not isinstance(xs, list) or not isinstance(ys, list) or len(xs) != len(ys):
        raise ValueError(
            f"Invalid LEAF data for user {user!r} in {where}: x and y must be "
            "lists of equal length"
        )
    if not xs:
        raise ValueError(f"Invalid LEAF data for user {user!r} in {where}: no samples")
    if isinstance(xs[0], str):
        lengths = {len(s) for s in xs}
        if len(lengths) != 1 or not all(isinstance(c, str) and len(c) == 1 for c in ys):
            raise ValueError(
                f"Invalid LEAF text data for user {user!r} in {where}: x must be "
                "strings of one length and y single characters"
            )
        x = np.stack([chars_to_indices(s) for s in xs]).astype(np.float32)
        y = chars_to_indices("".join(ys))
        return x, y, True
    try:
        x = np.asarray(xs, dtype=np.float64)
        yf = np.asarray(ys, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"Invalid LEAF data for user {user!r} in {where}: {exc}"
        ) from None
    if yf.ndim != 1 or not np.all(np.isfinite(yf)) or np.any(yf != np.round(yf)):
        raise ValueError(
            f"Invalid LEAF labels for user {user!r} in {where}: expected integers"
        )
    if yf.size and yf.min() < 0:
        raise ValueError(f"Invalid LEAF labels for user {user!r} in {where}: negative")
    return x.astype(np.float32), yf.astype(np.int64), False


def load_leaf(path: str | os.PathLike[str]) -> LeafData:
    """Read a LEAF JSON file, or every ``.json`` file of a directory.

    Parameters
    ----------
    path : str or os.PathLike
        A LEAF JSON file or a directory of them.

    Returns
    -------
    LeafData
        Users in file order with their arrays.

    Raises
    ------
    FileNotFoundError
        If the path does not exist or the directory has no ``.json`` file.
    ValueError
        If a file is not LEAF JSON, a user appears twice, ``num_samples``
        disagrees with the data, or feature shapes or kinds differ.
    """
    files = _leaf_files(Path(path))
    users: list[str] = []
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    kinds: set[bool] = set()
    seen: dict[str, str] = {}
    for file in files:
        with file.open("r", encoding="utf-8") as fh:
            try:
                blob = json.load(fh)
            except json.JSONDecodeError as exc:
                raise ValueError(f"Invalid LEAF file {file}: {exc}") from None
        if not isinstance(blob, dict) or not {"users", "user_data"} <= blob.keys():
            raise ValueError(f"Invalid LEAF file {file}: needs 'users' and 'user_data'")
        counts = blob.get("num_samples")
        if counts is not None and len(counts) != len(blob["users"]):
            raise ValueError(
                f"Invalid LEAF file {file}: len(num_samples) != len(users)"
            )
        for i, user in enumerate(blob["users"]):
            if user in seen:
                raise ValueError(
                    f"Invalid LEAF data: user {user!r} appears in both "
                    f"{seen[user]} and {file}"
                )
            seen[user] = str(file)
            if user not in blob["user_data"]:
                raise ValueError(f"Invalid LEAF file {file}: no user_data for {user!r}")
            x, y, text = _user_arrays(user, blob["user_data"][user], str(file))
            if counts is not None and int(counts[i]) != y.shape[0]:
                raise ValueError(
                    f"Invalid LEAF file {file}: num_samples says {counts[i]} for "
                    f"user {user!r} but it has {y.shape[0]} samples"
                )
            if xs and x.shape[1:] != xs[0].shape[1:]:
                raise ValueError(
                    f"Invalid LEAF data: user {user!r} has example shape "
                    f"{x.shape[1:]}, user {users[0]!r} has {xs[0].shape[1:]}"
                )
            kinds.add(text)
            users.append(str(user))
            xs.append(x)
            ys.append(y)
    if not users:
        raise ValueError(f"Invalid LEAF data at {path}: no users")
    if len(kinds) != 1:
        raise ValueError(f"Invalid LEAF data at {path}: mixes text and numeric users")
    logger.debug(
        "LEAF: %d users, %d samples from %d files",
        len(users),
        sum(y.shape[0] for y in ys),
        len(files),
    )
    return LeafData(
        users=tuple(users),
        x=tuple(xs),
        y=tuple(ys),
        is_text=kinds.pop(),
        files=tuple(f.name for f in files),
    )
