"""The link model's arithmetic, pinned bit for bit.

Every figure below was computed on the code before the 10,000-link speed-ups
(commit 4f7fdf4: ``python tests/netem/test_link_pinned.py`` prints them). A
faster ``Link.schedule``, ``DelayProcess``, distribution, loss process or TCP
path must give exactly the same deliveries, losses and moments for a given
seed: the digests hash ``repr`` of every float (which round-trips), so one
ulp of difference anywhere fails the test. A few values are spelt out so a
failure says where it starts.

Each scenario drives links of one kind through a fixed traffic pattern
(Poisson sends with bursts that queue and drop, idle gaps that restart TCP
slow start and let the loss chain run, 100 B to 200 KB messages).

The exact bits depend on the platform as well as on the code: numpy picks
SIMD kernels (``np.power``, ``np.exp``) by CPU, and these may differ from
libm in the last ulp. The digests are compared where they were computed
(:data:`PLATFORM`) and the test is skipped elsewhere; regenerate them there
on the old commit. The first deliveries (:data:`FIRST`) are compared
everywhere, to 1e-12.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import platform
from collections.abc import Callable, Iterator
from dataclasses import astuple

import numpy as np
import pytest

from netem.delayprocess import DelayProcess
from netem.dist import make_dist
from netem.empirical import Empirical
from netem.link import Bottleneck, Delivery, Link
from netem.linkparams import LinkParams
from netem.loss import Bernoulli, FourState, GilbertElliott
from netem.rng import stream
from netem.tcp import TcpParams
from netem.trace import Schedule, bundled_trace


def platform_id() -> str:
    """Machine, numpy version and the SIMD targets numpy dispatches to here."""
    try:
        umath = importlib.import_module("numpy._core._multiarray_umath")
        found = umath.__cpu_features__
        simd = ",".join(f for f in umath.__cpu_dispatch__ if found.get(f))
    except (ImportError, AttributeError):
        simd = "?"
    return f"{platform.machine()} numpy {np.__version__} {simd}"


SEED = 11
FAMILIES = ("constant", "uniform", "normal", "pareto", "paretonormal", "lognormal", "empirical")
MODES = ("tcp", "drop", "message")
TABLE = Empirical(tuple(float(x) for x in np.linspace(0.01, 0.05, 41) ** 1.5))


def traffic(n: int, seed: int) -> Iterator[tuple[float, int]]:
    """``n`` (t_send, nbytes): Poisson at 20/s, a burst of 6 every 25, a 3 s gap every 40."""
    rng = np.random.default_rng(seed)
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(0.05))
        if i % 40 == 39:
            t += 3.0
        sizes = (100, 1448, 5000, 64_000, 200_000)
        nbytes = int(sizes[int(rng.integers(len(sizes)))] * float(rng.uniform(0.5, 1.0)))
        for _ in range(6 if i % 25 == 24 else 1):
            yield t, nbytes


def digest(rows: list[tuple[object, ...]]) -> str:
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def drive(link: Link, n: int = 300, seed: int = 5) -> list[tuple[object, ...]]:
    rows = [astuple(link.schedule(t, nb)) for t, nb in traffic(n, seed)]
    rows.append(astuple(link.loss_stats))
    c = link.connection
    rows.append((c.srtt, c.rttvar, c.cwnd, c.ssthresh, c.last_activity))
    return rows


def params(family: str, mode: str, **kw: object) -> LinkParams:
    base: dict[str, object] = {
        "delay": 0.02,
        "jitter": 0.0 if family == "constant" else 0.006,
        "distribution": family,
        "rate": 20e6,
        "loss": Bernoulli(0.02),
        "loss_mode": mode,
        "queue_limit": 150_000 if mode != "tcp" else None,
    }
    if family == "empirical":
        base["table"] = TABLE
    base.update(kw)
    return LinkParams(**base)  # type: ignore[arg-type]


def family_mode(family: str, mode: str) -> list[tuple[object, ...]]:
    p = params(family, mode, delay_correlation=0.3 if family in ("normal", "pareto") else 0.0)
    return drive(Link(p, seed=SEED, key=("pin", family, mode)))


def chains() -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for i, model in enumerate((GilbertElliott(0.01, 0.3), FourState(0.01, 0.2, 0.1, 0.5, 0.002))):
        for mode in MODES:
            p = params("uniform", mode, loss=model)
            rows += drive(Link(p, seed=SEED, key=("chain", i, mode)), n=200)
    return rows


def trace_link() -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for mode in ("tcp", "drop"):
        p = params("normal", mode, rate=None, trace=bundled_trace("bursty"))
        rows += drive(Link(p, seed=SEED, key=("trace", mode)), n=200)
    return rows


def shared_bottleneck() -> list[tuple[object, ...]]:
    b = Bottleneck(30e6, queue_limit=300_000)
    links = [
        Link(params("uniform", m, rate=50e6), seed=SEED, key=("bn", m), bottleneck=b)
        for m in ("tcp", "drop")
    ]
    rows: list[tuple[object, ...]] = []
    for k, (t, nb) in enumerate(traffic(400, 9)):
        rows.append(astuple(links[k % 2].schedule(t, nb)))
    return rows


def changing() -> list[tuple[object, ...]]:
    sched = Schedule(
        [
            (2.0, {"delay": 0.08, "jitter": 0.02}),
            (5.0, {"distribution": "pareto", "loss": GilbertElliott(0.02, 0.25)}),
            (8.0, {"rate": 2e6, "delay_correlation": 0.5}),
            (11.0, {"loss": None, "loss_mode": "drop"}),
        ]
    )
    return drive(Link(params("normal", "tcp"), seed=SEED, key=("sched",), changes=sched))


def routed() -> list[tuple[object, ...]]:
    def route(d: Delivery) -> Delivery:
        if d.index % 7 == 3:
            return d.dropped_by("scripted")
        return d.delayed_by(0.05) if d.index % 5 == 1 else d

    link = Link(params("paretonormal", "message"), seed=SEED, key=("route",), route=route)
    return drive(link, n=150)


def no_loss_no_rate() -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for mode in MODES:
        p = LinkParams(delay=0.03, jitter=0.01, distribution="normal", loss_mode=mode)
        rows += drive(Link(p, seed=SEED, key=("plain", mode)), n=150)
    return rows


def harsh() -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for i, model in enumerate((Bernoulli(0.7), GilbertElliott(0.2, 0.05))):
        p = params("normal", "tcp", loss=model, tcp=TcpParams(max_retries=6, cc="reno"))
        rows += drive(Link(p, seed=SEED, key=("harsh", i)), n=40)
    return rows


def delay_draws() -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for family in FAMILIES:
        jitter = 0.0 if family == "constant" else 0.03  # jitter > mean: the 0-clip matters
        dist = make_dist(family, 0.02, jitter, TABLE)
        for rho in (0.0, 0.6):
            a = DelayProcess(dist, rho, stream(SEED, "draws", family, str(rho)))
            b = DelayProcess(dist, rho, stream(SEED, "draws", family, str(rho)))
            one = [a.next() for _ in range(50)]
            many = b.draw(50).tolist()
            assert one == many, (family, rho)
            one += [a.next() for _ in range(5)]
            rows.append(tuple(one))
    return rows


def moments() -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for family in FAMILIES:
        for mean, jitter in ((0.02, 0.006), (0.01, 0.03), (0.0, 0.004), (1.7, 0.5)):
            if family == "constant":
                jitter = 0.0
            elif family == "lognormal" and mean == 0.0:
                continue
            rows.append((family, mean, jitter, make_dist(family, mean, jitter, TABLE).moments()))
    return rows


SCENARIOS: dict[str, Callable[[], list[tuple[object, ...]]]] = {
    **{
        f"{f}/{m}": (lambda f=f, m=m: family_mode(f, m))  # type: ignore[misc]
        for f in FAMILIES
        for m in MODES
    },
    "chains": chains,
    "trace": trace_link,
    "bottleneck": shared_bottleneck,
    "schedule": changing,
    "route": routed,
    "no-loss-no-rate": no_loss_no_rate,
    "harsh": harsh,
    "delay-draws": delay_draws,
    "moments": moments,
}

# python tests/netem/test_link_pinned.py  (on commit 4f7fdf4)
PLATFORM = "x86_64 numpy 2.4.6 X86_V3,X86_V4,AVX512_ICL"
PINNED = {
    "bottleneck": "f16b979b6d88f70c",
    "chains": "128ab2c651d286ac",
    "constant/drop": "5828c65dfad4170f",
    "constant/message": "d79d272d81d0d51b",
    "constant/tcp": "f6706c3a9c80579b",
    "delay-draws": "c3acbed89882f7ee",
    "empirical/drop": "ab6fc56fc2ed463d",
    "empirical/message": "65c5c8012d4a50f4",
    "empirical/tcp": "32e13a2696f6939c",
    "harsh": "407e8285063faf8f",
    "lognormal/drop": "2d1ebd59410d5c9d",
    "lognormal/message": "98e2a3c41b57ef4d",
    "lognormal/tcp": "ef89b900e1285213",
    "moments": "dfeba04b9c6fbde1",
    "no-loss-no-rate": "87c5ea69b279c555",
    "normal/drop": "ae75c2967440a9f5",
    "normal/message": "a2afb40b0c0e0eef",
    "normal/tcp": "31dda675376447c6",
    "pareto/drop": "b03c29acce0ca845",
    "pareto/message": "f0fdedde61cfb065",
    "pareto/tcp": "ae9ab1106f1e3f13",
    "paretonormal/drop": "3c36bd7803412322",
    "paretonormal/message": "d4a1f8e5336a1ecc",
    "paretonormal/tcp": "3f7f935351c523da",
    "route": "a251aabe3575ab0b",
    "schedule": "260fa3c9103ad833",
    "trace": "462f14b228f07143",
    "uniform/drop": "c79cd7299d02139d",
    "uniform/message": "e988392ab50ca5e5",
    "uniform/tcp": "f65b2a95221db623",
}

# t_deliver of the first five messages of three links, as they read
FIRST = {
    "normal/tcp": [
        0.11463991038151952,
        0.2625715975867826,
        0.2625715975867826,
        0.2625715975867826,
        0.35533117145117027,
    ],
    "paretonormal/drop": [
        0.14097523894961866,
        math.inf,
        0.18710143517719321,
        0.18990194796281018,
        0.2807065873919804,
    ],
    "uniform/message": [
        0.1183341002250918,
        0.18705664712646786,
        0.19183208659901393,
        0.19183208659901393,
        0.2890202061267093,
    ],
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_pinned_digest(name: str) -> None:
    if platform_id() != PLATFORM:
        pytest.skip(f"digests are of {PLATFORM}, this is {platform_id()}")
    assert digest(SCENARIOS[name]()) == PINNED[name]


@pytest.mark.parametrize("name", sorted(FIRST))
def test_pinned_first_deliveries(name: str) -> None:
    f, m = name.split("/")
    got = [row[2] for row in family_mode(f, m)[:5]]
    assert got == pytest.approx(FIRST[name], rel=1e-12)


if __name__ == "__main__":
    print(f"PLATFORM = {platform_id()!r}")
    print("PINNED = {")
    for name in sorted(SCENARIOS):
        print(f"    {name!r}: {digest(SCENARIOS[name]())!r},")
    print("}")
    print("FIRST = {")
    for name in ("normal/tcp", "paretonormal/drop", "uniform/message"):
        f, m = name.split("/")
        print(f"    {name!r}: {[row[2] for row in family_mode(f, m)[:5]]!r},")
    print("}")
