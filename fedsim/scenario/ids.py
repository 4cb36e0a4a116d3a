"""Client-id ranges as people write them: ``"0-49"``, ``"0-9,20-29"``, ``"7"``."""

from __future__ import annotations

import itertools

__all__ = ["format_id_list", "format_ids", "parse_id_list", "parse_ids", "split_ids"]


def parse_ids(text: str, limit: int | None = None) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]``; ValueError naming the bad part.

    With ``limit``, every id must be below it. Ids come out sorted, each once.
    """
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError(f"bad id range {part!r} (write e.g. 0-49 or 0-9,20-29)") from None
        if a < 0 or b < a:
            raise ValueError(f"bad id range {part!r}: want 0 <= first <= last")
        if limit is not None and b >= limit:
            raise ValueError(f"id range {part!r} goes past the scenario's {limit} clients "
                             f"(ids 0-{limit - 1})")
        out.update(range(a, b + 1))
    if not out:
        raise ValueError(f"no client ids in {text!r}")
    return sorted(out)


def format_ids(ids: list[int] | tuple[int, ...]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the inverse of :func:`parse_ids`)."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def split_ids(num_clients: int, parts: int) -> list[str]:
    """``num_clients`` ids in ``parts`` contiguous ranges as even as possible."""
    if not 1 <= parts <= num_clients:
        raise ValueError(f"cannot split {num_clients} clients into {parts} hosts")
    base, extra = divmod(num_clients, parts)
    out, start = [], 0
    for p in range(parts):
        n = base + (p < extra)
        out.append(format_ids(list(range(start, start + n))))
        start += n
    return out


def format_id_list(ids: list[int] | tuple[int, ...]) -> str:
    """Ids for a child process's command line, in their order: ``"START:STOP:STEP"``
    when they step evenly (a host's round-robin share of the clients), else
    ``"0,2,5"``.

    Linux caps one argument at 128 KB: the 25,000 ids of a host's share of
    50,000 clients, written out, exceed it.
    """
    if len(ids) >= 3:
        step = ids[1] - ids[0]
        if step > 0 and all(b - a == step for a, b in itertools.pairwise(ids)):
            return f"{ids[0]}:{ids[-1] + 1}:{step}"
    return ",".join(map(str, ids))


def parse_id_list(text: str) -> list[int]:
    """:func:`format_id_list` undone (``""``: no ids)."""
    if ":" in text:
        start, stop, step = (int(x) for x in text.split(":"))
        return list(range(start, stop, step))
    return [int(c) for c in text.split(",") if c]
