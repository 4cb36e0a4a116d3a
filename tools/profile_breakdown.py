"""Where a command's CPU goes: py-spy samples of its whole process tree, by process and by library.

Runs ``COMMAND`` under ``py-spy record --subprocesses`` (py-spy is not one
of fedsim's dependencies: ``pip install py-spy``, or ``--py-spy PATH``) and
attributes every sample twice:

* to its **process**: fedsim's server, a client host, a torch trainer, the
  evaluator, a Flower ServerApp's process, or the command's own;
* to the **library** of the innermost frame that belongs to one: fedsim's
  Flower bridge (``fedsim/flower/``), Flower (``flwr``), torch, numpy,
  protobuf, pyzmq, msgpack, netem, the rest of fedsim, asyncio, the app's
  own code (any other file), the interpreter's start-up (imports).

and prints CPU seconds (samples / rate) per process and library, so a
per-round overhead can be split between fedsim's code, the app's and
Flower's. Samples are of running threads only (py-spy's default: idle
threads are not sampled), at ``--rate`` per second, so a figure's error
is about ``1 / rate`` s per sample missed; it is a breakdown, not a
timer.

    python tools/profile_breakdown.py -- fedsim run examples/flower/lan.toml --out /tmp/r
    python tools/profile_breakdown.py --raw /tmp/prof.txt      # an earlier recording
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

#: (library, a path fragment that marks its frames), checked in order (py-spy names a
#: frame's file relative to its sys.path entry: ``fedsim/cli.py``, ``torch/nn/...``)
LIBRARIES = [
    ("fedsim's Flower bridge", "fedsim/flower/"),
    ("Flower", "flwr/"),
    ("protobuf", "google/protobuf/"),
    ("torch", "torch/"),
    ("numpy", "numpy/"),
    ("pyzmq", "zmq/"),
    ("msgpack", "msgpack/"),
    ("netem", "netem/"),
    ("fedsim", "fedsim/"),
    ("asyncio", "asyncio/"),
]

_FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
_PROCESS = re.compile(r'^process (?P<pid>\d+):"(?P<cmd>.*)"$')


def _file(frame: str) -> str:
    m = _FRAME.match(frame)
    return m.group("file") if m else frame


def _is(path: str, mark: str) -> bool:
    return path.startswith(mark) or f"/{mark}" in path


def library(frames: list[str]) -> str:
    """The library a stack's CPU is spent in (``frames`` root first): start-up
    imports when an import is on the stack, else its innermost frame that
    belongs to a library, else the app's own code."""
    files = [_file(f) for f in frames]
    if any("importlib" in f for f in files):
        return "imports"
    for path in reversed(files):
        for name, mark in LIBRARIES:
            if _is(path, mark):
                return name
    return "the app's code"


def process_kind(cmd: str, frames: list[str]) -> str:
    """What a process of fedsim's tree is, from its command line and a stack of it."""
    files = [_file(f) for f in frames]
    if "fedsim.flower.serverapp" in cmd or any(_is(f, "fedsim/flower/serverapp.py")
                                               for f in files):
        return "Flower ServerApp"
    if any(_is(f, "fedsim/actors/worker.py") for f in files):
        return "torch worker"
    if any(_is(f, "fedsim/actors/_zygote_server.py") for f in files):
        return "zygote"
    if "fedsim.actors.host" in cmd or any(_is(f, "fedsim/actors/host.py") for f in files):
        return "client host"
    return "server / main"


def parse(raw: str) -> tuple[Counter[tuple[str, str]], dict[str, int]]:
    """Samples per (process kind, library), and per process kind, from py-spy's raw
    (collapsed-stack) output."""
    by: Counter[tuple[str, str]] = Counter()
    kinds: dict[str, int] = defaultdict(int)
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        cmd = ""
        m = _PROCESS.match(frames[0])
        if m:
            cmd, frames = m.group("cmd"), frames[1:]
        frames = [f for f in frames if not f.startswith("thread (")]
        kind = process_kind(cmd, frames)
        n = int(count)
        by[(kind, library(frames))] += n
        kinds[kind] += n
    return by, dict(kinds)


def report(by: Counter[tuple[str, str]], kinds: dict[str, int], rate: int) -> str:
    """The breakdown as text: CPU seconds per process, then per library within it."""
    total = sum(kinds.values())
    lines = [f"{total / rate:.2f} CPU s sampled ({total} samples at {rate}/s)", ""]
    for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]):
        lines.append(f"{kind:<18} {n / rate:8.2f} s  {100 * n / max(total, 1):5.1f} %")
        libs = sorted(((lib, c) for (k, lib), c in by.items() if k == kind), key=lambda x: -x[1])
        for lib, c in libs:
            if c / rate >= 0.005:
                lines.append(f"    {lib:<24} {c / rate:8.2f} s  {100 * c / max(n, 1):5.1f} %")
    libs_all: Counter[str] = Counter()
    for (_, lib), c in by.items():
        libs_all[lib] += c
    lines += ["", "by library, every process:"]
    for lib, c in libs_all.most_common():
        lines.append(f"    {lib:<24} {c / rate:8.2f} s  {100 * c / max(total, 1):5.1f} %")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--py-spy", default=shutil.which("py-spy"), help="py-spy's path")
    ap.add_argument("--rate", type=int, default=200, help="samples per second")
    ap.add_argument("--raw", default=None, help="read this recording instead of running")
    ap.add_argument("--keep", default=None, help="keep the recording here")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.raw:
        raw = Path(args.raw).read_text()
    else:
        cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not cmd:
            ap.error("give a command after --, or --raw FILE")
        if not args.py_spy:
            ap.error("py-spy not found: pip install py-spy, or --py-spy PATH")
        out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp()) / "profile.txt"
        rc = subprocess.call([args.py_spy, "record", "--subprocesses", "--format", "raw",
                              "--rate", str(args.rate), "--output", str(out), "--", *cmd])
        if rc != 0 or not out.exists():
            print(f"the command or py-spy failed (exit {rc})", file=sys.stderr)
            return 1
        raw = out.read_text()
    print(report(*parse(raw), args.rate))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
