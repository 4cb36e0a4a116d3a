"""The C library through ctypes, loaded without spawning a process.

``ctypes.util.find_library("c")`` runs ``/sbin/ldconfig -p`` in a subprocess
on Linux: 10-30 ms for every call, which fedsim made in every process it
started (a worker forked from a large parent paid the most), all of it on
the way to a run's first round. glibc's library is ``libc.so.6`` on every
Linux ABI it supports; failing that, the symbols the process already has
(``dlopen(NULL)``: the interpreter is linked against the C library) serve.
"""

from __future__ import annotations

import ctypes
import functools

__all__ = ["libc"]


@functools.cache
def libc() -> ctypes.CDLL | None:
    """This process's C library (``use_errno``), or None where there is none to load."""
    for name in ("libc.so.6", None):
        try:
            return ctypes.CDLL(name, use_errno=True)
        except OSError:
            continue
    return None
