"""DGA: parity with Algorithm 1, the Lemma A.1 mean invariant, D = 0 = FedAvg,
paper and auto modes under scripted latency, and the client's transition table."""

from __future__ import annotations

import copy
import heapq
import math
import random

import dga_reference as ref
import pytest
import torch

from fedsim.algorithms import NonFiniteUpdate, fedavg_aggregate
from fedsim.algorithms.dga import (
    CLIENT_TRANSITIONS,
    Corrected,
    DGAClient,
    DGAConfig,
    DGAProtocolError,
    DGAServer,
    Done,
    Send,
    Step,
    Wait,
    dga_c_beta,
    dga_correction,
    dga_split_delay,
)
from fedsim.wire import statefile
from fedsim.wire.messages import Update

# ---------------------------------------------------------------- fixtures

W1 = [0.3, -1.2, 2.0]
A = [[0.5, 1.0, 0.2], [0.9, 0.3, 0.7], [0.4, 0.6, 1.1], [1.2, 0.2, 0.5], [0.7, 0.8, 0.3]]
B = [[1.0, 0.0, -1.0], [-2.0, 1.5, 0.5], [0.5, -0.5, 2.0], [0.0, 2.0, 1.0], [1.5, 1.0, -0.5]]


def grad_list(i: int, t: int, k: int, w: list[float]) -> list[float]:
    """Client i's quadratic plus a deterministic "minibatch noise" per (t, k)."""
    a, b = A[i % len(A)], B[i % len(B)]
    return [
        a[j] * (w[j] - b[j]) + 0.1 * math.sin(1 + i + 3 * t + 7 * k + 11 * j) for j in range(len(w))
    ]


def grad_t(i: int, t: int, k: int, w: torch.Tensor) -> torch.Tensor:
    return torch.tensor(grad_list(i, t, k, w.tolist()), dtype=w.dtype)


def const_lr(t: int, k: int) -> float:
    return 0.1


def sched_lr(t: int, k: int) -> float:
    return 0.1 * (1.0 + 0.5 * math.cos(0.7 * t + 0.3 * k))


def w1(dtype=torch.float64) -> torch.Tensor:
    return torch.tensor(W1, dtype=dtype)


def pump(clients, server, i, log=None):
    """Let client i send whatever it has; broadcast completed averages."""
    while isinstance(act := clients[i].next_action(), Send):
        mean = server.add(act.round, i, act.m)
        clients[i].sent(act.round)
        if mean is not None:
            for c in clients:
                out = c.apply_average(act.round, mean)
                if log is not None:
                    log.extend(out)


def lockstep(cfg, n, steps, lr=const_lr, dtype=torch.float64):
    """Every client takes step j before any takes step j + 1 (the paper's schedule).

    Returns the clients and, after every step, their models and their
    descent directions d (g, or u with momentum).
    """
    clients = [DGAClient(cfg, w1(dtype), client=i) for i in range(n)]
    server = DGAServer(n)
    trace, dirs = [], []
    u = [torch.zeros(len(W1), dtype=dtype) for _ in range(n)]
    for _ in range(steps):
        ds = []
        for i, c in enumerate(clients):
            act = c.next_action()
            assert isinstance(act, Step), act
            g = grad_t(i, act.round, act.k, c.w)
            u[i] = cfg.momentum * u[i] + g
            ds.append(u[i] if cfg.momentum else g)
            c.step(g, lr(act.round, act.k))
            pump(clients, server, i)
        for c in clients:  # the paper never waits when averages are instant
            assert not isinstance(c.next_action(), Wait)
        trace.append([c.w.clone() for c in clients])
        dirs.append(ds)
    return clients, trace, dirs


def simulate(cfg, n, latency, seed=0, lr=const_lr, max_ticks=5000):
    """Clients step once per tick; an average reaches client j ``latency(rng)``
    ticks after its round completed. Blocked clients stall."""
    rng = random.Random(seed)
    clients = [DGAClient(cfg, w1(), client=i) for i in range(n)]
    server = DGAServer(n)
    inbox: list = []
    seq = 0
    seen: dict = {}  # (i, t, k) -> w at which the gradient was taken
    log: list = []  # (client, Corrected)
    stalls = [0] * n
    for tick in range(max_ticks):
        while inbox and inbox[0][0] <= tick:
            _, _, j, t, mean = heapq.heappop(inbox)
            log += [(j, rec) for rec in clients[j].apply_average(t, mean)]
        for i, c in enumerate(clients):
            while True:
                act = c.next_action()
                if isinstance(act, Send):
                    mean = server.add(act.round, i, act.m)
                    c.sent(act.round)
                    for j in range(n) if mean is not None else ():
                        seq += 1
                        heapq.heappush(inbox, (tick + latency(rng), seq, j, act.round, mean))
                    continue
                if isinstance(act, Step):
                    seen[(i, act.round, act.k)] = c.w.clone()
                    g = grad_t(i, act.round, act.k, c.w)
                    log += [(i, rec) for rec in c.step(g, lr(act.round, act.k))]
                elif isinstance(act, Wait) and c.state == "blocked":
                    stalls[i] += 1  # a stall in training, not the final drain
                break
        if all(isinstance(c.next_action(), Done) for c in clients):
            return clients, seen, log, stalls
    raise AssertionError("simulation did not finish")


def same_state(a: dict, b: dict) -> bool:
    def eq(x, y):
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and torch.equal(x, y)
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, list | tuple):
            return len(x) == len(y) and all(eq(p, q) for p, q in zip(x, y, strict=True))
        return x == y

    return eq(a, b)


# ---------------------------------------------------------------- functional core


def test_split_delay_matches_the_paper_r_in_1_to_k():
    """R-DG1: D = sK + r, r in [1, K]; R-DG2: D = 0 gives s = -1, r = K."""
    for K in (1, 3, 5):
        for D in range(0, 26):
            s, r = dga_split_delay(D, K)
            assert s * K + r == D
            assert 1 <= r <= K
            assert s == (-1 if D == 0 else (D - 1) // K)
            if D:  # "k == D (mod K)" over k in 1..K selects exactly k = r
                assert [k for k in range(1, K + 1) if (k - D) % K == 0] == [r]


def test_c_beta_values():
    assert dga_c_beta(0.9, 20) == pytest.approx((1 - 0.9**20) / 0.1)
    assert dga_c_beta(0.9, 2) == pytest.approx(1.9)
    assert dga_c_beta(0.9, 1) == 1.0
    assert dga_c_beta(0.9, 0) == 1.0  # not 0: that would drop the averaging (R-DG2)
    assert dga_c_beta(0.0, 20) == 1.0
    for D in (1, 5, 20):
        assert dga_c_beta(0.9, D) == pytest.approx(ref.c_beta_paper(0.9, D))


def test_corrections_cancel_over_clients():
    gen = torch.Generator().manual_seed(0)
    own = [torch.randn(4, generator=gen, dtype=torch.float64) for _ in range(5)]
    mean = sum(own) / 5
    total = sum(dga_correction(m, mean, 0.3, 2.0) for m in own)
    assert torch.allclose(total, torch.zeros(4, dtype=torch.float64), atol=1e-12)


# ---------------------------------------------------------------- parity with Algorithm 1

PARITY = [
    {"K": 3, "D": 0},
    {"K": 3, "D": 1},
    {"K": 3, "D": 3},
    {"K": 3, "D": 5},
    {"K": 3, "D": 7},  # s = 2: three rounds in flight
    {"K": 5, "D": 20, "beta": 0.9},
    {"K": 3, "D": 4, "beta": 0.9},
    {"K": 3, "D": 0, "beta": 0.9},
    {"K": 3, "D": 4, "beta": 0.5, "c_beta": 2.5},
    {"K": 3, "D": 4, "lr": "sched"},
    {"K": 3, "D": 4, "lr": "sched", "accumulate": "displacement"},
    {"K": 3, "D": 5, "beta": 0.9, "lr": "sched", "accumulate": "displacement"},
    {"K": 3, "D": 2, "correction": "none"},
    {"K": 3, "D": 5, "correction": "none", "beta": 0.9},
    {"K": 3, "D": 2, "correction": "overwrite"},
    {"K": 3, "D": 7, "correction": "overwrite", "lr": "sched", "accumulate": "displacement"},
]


def _config(p: dict, **extra) -> DGAConfig:
    return DGAConfig(
        local_steps=p["K"],
        delay=p["D"],
        lr=0.1,
        momentum=p.get("beta", 0.0),
        accumulate=p.get("accumulate", "raw"),
        correction=p.get("correction", "full"),
        c_beta=p.get("c_beta", "paper"),
        **extra,
    )


def _ids(ps):
    return ["-".join(f"{k}{v}" for k, v in p.items()) for p in ps]


@pytest.mark.parametrize("p", PARITY, ids=_ids(PARITY))
def test_parity_with_reference_every_step(p):
    n, rounds = 4, 6
    lr = sched_lr if p.get("lr") == "sched" else const_lr
    expected = ref.dga(
        W1,
        grad_list,
        n,
        p["K"],
        p["D"],
        rounds,
        lr,
        beta=p.get("beta", 0.0),
        c_beta=p.get("c_beta"),
        accumulate=p.get("accumulate", "raw"),
        correction=p.get("correction", "full"),
    )
    _, trace, _ = lockstep(_config(p), n, p["K"] * rounds, lr=lr)
    for step, (got, want) in enumerate(zip(trace, expected, strict=True)):
        for i in range(n):
            want_i = torch.tensor(want[i], dtype=torch.float64)
            assert torch.allclose(got[i], want_i, rtol=1e-12, atol=1e-12), (step, i)


def test_parity_in_float32():
    p = {"K": 5, "D": 20, "beta": 0.9}
    expected = ref.dga(W1, grad_list, 4, 5, 20, 8, const_lr, beta=0.9)
    _, trace, _ = lockstep(_config(p), 4, 40, dtype=torch.float32)
    for got, want in zip(trace, expected, strict=True):
        for i in range(4):
            assert got[i].dtype == torch.float32
            assert torch.allclose(
                got[i].double(), torch.tensor(want[i], dtype=torch.float64), atol=1e-4
            )


# ---------------------------------------------------------------- Lemma A.1


@pytest.mark.parametrize("beta", [0.0, 0.9])
@pytest.mark.parametrize("D", [0, 1, 2, 5, 7, 12, 13])
def test_mean_invariant_every_step(D, beta):
    """wbar_{k+1} = wbar_k - (eta/N) sum_i d_i at every step, corrected or not."""
    n, K = 4, 5
    cfg = DGAConfig(local_steps=K, delay=D, lr=0.1, momentum=beta)
    _, trace, dirs = lockstep(cfg, n, K * 6)
    wbar = w1()
    for step, (ws, ds) in enumerate(zip(trace, dirs, strict=True)):
        wbar = wbar - 0.1 / n * sum(ds)
        assert torch.allclose(sum(ws) / n, wbar, rtol=0, atol=1e-12), step


def test_clients_differ_only_in_their_last_d_gradients():
    """Right after a correction, w^i = shared part - eta * (own recent gradients)."""
    n, K, D = 3, 3, 4  # s = 1, r = 1
    cfg = DGAConfig(local_steps=K, delay=D, lr=0.1)
    _, trace, dirs = lockstep(cfg, n, K * 5)
    step = 3 * K  # after step (t=4, k=1): the correction of round 2 fired
    shared = [
        trace[step][i] + 0.1 * sum(d[i] for d in dirs[step + 1 - D : step + 1]) for i in range(n)
    ]
    for i in range(1, n):
        assert torch.allclose(shared[i], shared[0], atol=1e-12)


# ---------------------------------------------------------------- D = 0 and N = 1


@pytest.mark.parametrize("beta", [0.0, 0.9])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_delay_zero_is_fedavg(beta, dtype):
    n, K, rounds = 4, 3, 5
    cfg = DGAConfig(local_steps=K, delay=0, lr=0.1, momentum=beta, c_beta=7.0)
    _, trace, _ = lockstep(cfg, n, K * rounds, dtype=dtype)
    x = w1(dtype)
    u = [torch.zeros(len(W1), dtype=dtype) for _ in range(n)]  # local buffers stay local
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    for t in range(1, rounds + 1):
        results = []
        for i in range(n):
            y = x.clone()
            for k in range(1, K + 1):
                u[i] = beta * u[i] + grad_t(i, t, k, y)
                y = y - 0.1 * u[i]
            results.append(Update.of(client=i, base_version=t - 1, params=y))
        x = fedavg_aggregate(x, results, weighting="uniform")
        for i in range(n):
            assert torch.allclose(trace[t * K - 1][i], x, rtol=0, atol=tol), (t, i)


@pytest.mark.parametrize(("D", "beta"), [(0, 0.0), (3, 0.0), (12, 0.0), (4, 0.9)])
def test_single_client_is_plain_sgd(D, beta):
    cfg = DGAConfig(local_steps=5, delay=D, lr=0.1, momentum=beta)
    _, trace, _ = lockstep(cfg, 1, 30)
    w, u = w1(), torch.zeros(3, dtype=torch.float64)
    for step in range(30):
        t, k = step // 5 + 1, step % 5 + 1
        u = beta * u + grad_t(0, t, k, w)
        w = w - 0.1 * u
        assert torch.allclose(trace[step][0], w, atol=1e-12)


# ---------------------------------------------------------------- momentum factor


def test_momentum_correction_uses_c_beta():
    """K = 1, D = 2 (s = 1, r = 1): step 1 of round 3 corrects round 1 with
    w <- w - eta (u - c_beta (v_1 - vbar_1)), c_beta = 1 + beta."""
    beta, eta = 0.5, 0.1
    cfg = DGAConfig(local_steps=1, delay=2, lr=eta, momentum=beta)
    c = [DGAClient(cfg, torch.zeros(1, dtype=torch.float64), client=i) for i in range(2)]
    gs = {0: [1.0, 2.0, 3.0], 1: [5.0, 0.0, -1.0]}
    avgs = {}
    for t in range(1, 4):
        for i in (0, 1):
            before = c[i].w.clone()
            out = c[i].step(torch.tensor([gs[i][t - 1]], dtype=torch.float64))
            if t < 3:
                assert out == ()
            else:
                assert out == (Corrected(1, 2, pytest.approx(1 + beta)),)
                u = beta**2 * gs[i][0] + beta * gs[i][1] + gs[i][2]
                v1, vbar1 = gs[i][0], (gs[0][0] + gs[1][0]) / 2
                want = before - eta * (u - (1 + beta) * (v1 - vbar1))
                assert torch.allclose(c[i].w, want)
            act = c[i].next_action()
            assert isinstance(act, Send)
            avgs.setdefault(t, []).append(act.m)
            c[i].sent(t)
        mean = sum(avgs[t]) / 2
        for i in (0, 1):
            assert c[i].apply_average(t, mean) == ()  # paper mode: held until due


@pytest.mark.parametrize(
    ("c_beta", "D", "want"), [(2.5, 4, 2.5), (2.5, 0, 1.0), ("paper", 4, None)]
)
def test_c_beta_override_and_fedavg_mode(c_beta, D, want):
    cfg = DGAConfig(local_steps=2, delay=D, lr=0.1, momentum=0.9, c_beta=c_beta)
    log: list = []
    clients = [DGAClient(cfg, w1(), client=i) for i in range(2)]
    server = DGAServer(2)
    for _ in range(8):
        for i, c in enumerate(clients):
            act = c.next_action()
            log.extend(c.step(grad_t(i, act.round, act.k, c.w)))
            pump(clients, server, i, log)
    assert log
    for rec in log:
        assert rec.delay == D
        assert rec.c_beta == pytest.approx(dga_c_beta(0.9, D) if want is None else want)


def test_momentum_with_c_beta_one_shares_everything_older_than_d_steps():
    """v_t = sum of the round's u is the round's whole displacement / eta, so
    c_beta = 1 replaces it exactly by the average: right after a correction the
    clients differ only in their last D momentum steps (with d = u)."""
    n, K, D = 3, 3, 4
    cfg = DGAConfig(local_steps=K, delay=D, lr=0.1, momentum=0.9, c_beta=1.0)
    _, trace, dirs = lockstep(cfg, n, K * 5)
    step = 3 * K
    shared = [
        trace[step][i] + 0.1 * sum(d[i] for d in dirs[step + 1 - D : step + 1]) for i in range(n)
    ]
    for i in range(1, n):
        assert torch.allclose(shared[i], shared[0], atol=1e-12)


@pytest.mark.parametrize("D", [5, 20])
def test_printed_c_beta_over_corrects_momentum_and_clients_drift_apart(D):
    """R-DG3 as printed multiplies v (which already carries the momentum) by
    (1 - beta^D) / (1 - beta): each correction flips a client's deviation from
    the mean and scales it by c_beta - 1, so the spread grows geometrically at
    any learning rate, while c_beta = 1 keeps it bounded (Lemma 2.2)."""

    def spread(c_beta):
        cfg = DGAConfig(local_steps=5, delay=D, lr=0.005, momentum=0.9, c_beta=c_beta)
        _, trace, _ = lockstep(cfg, 5, 5 * 60, lr=lambda t, k: 0.005)
        ws = trace[-1]
        return max(float((w - sum(ws) / 5).norm()) for w in ws)

    assert spread(1.0) < 2.0
    assert spread("paper") > 1e4


# ---------------------------------------------------------------- raw vs displacement


def test_raw_and_displacement_agree_with_a_constant_lr():
    for beta in (0.0, 0.9):
        raw = lockstep(DGAConfig(local_steps=3, delay=4, momentum=beta), 3, 18)[1]
        disp = lockstep(
            DGAConfig(local_steps=3, delay=4, momentum=beta, accumulate="displacement"), 3, 18
        )[1]
        for a, b in zip(raw, disp, strict=True):
            for x, y in zip(a, b, strict=True):
                assert torch.allclose(x, y, atol=1e-12)


@pytest.mark.parametrize("accumulate", ["raw", "displacement"])
def test_lr_schedule_displacement_is_exact(accumulate):
    """R-DG7: after every correction (drained), displacement leaves all clients on one
    model w_1 - sum Mbar; raw corrections with a changing eta do not."""
    cfg = DGAConfig(local_steps=3, delay=4, mode="auto", rounds=5, accumulate=accumulate)
    clients, _, _, _ = simulate(cfg, 3, lambda rng: rng.randint(1, 6), lr=sched_lr)
    spread = max(float((c.w - clients[0].w).abs().max()) for c in clients)
    if accumulate == "displacement":
        assert spread < 1e-12
    else:
        assert spread > 1e-6


# ---------------------------------------------------------------- paper mode timing


def _drive_alone(client, until, deliver=None):
    """Step client 0 with the quadratic until ``until(action)``; collect its sends."""
    sends = []
    while not until(act := client.next_action()):
        if isinstance(act, Send):
            sends.append(act)
            client.sent(act.round)
            if deliver:
                deliver(act)
        elif isinstance(act, Step):
            client.step(grad_t(0, act.round, act.k, client.w))
        else:
            raise AssertionError(act)
    return act, sends


def test_paper_waits_at_step_r_of_round_t0_plus_1_plus_s():
    cfg = DGAConfig(local_steps=3, delay=4, lr=0.1)  # s = 1, r = 1
    c = DGAClient(cfg, w1())
    act, sends = _drive_alone(c, lambda a: isinstance(a, Wait))
    assert act == Wait(1)
    assert [s.round for s in sends] == [1, 2]
    assert (c.round, c.k, c.steps) == (3, 2, 7)  # step (3, 1) is taken, 4 steps after the send
    assert c.state == "blocked"
    w_before = c.w.clone()
    mean = sends[0].m * 0.5
    (rec,) = c.apply_average(1, mean)
    assert rec == Corrected(round=1, delay=4, c_beta=1.0)
    g = grad_t(0, 3, 1, w_before)
    assert torch.allclose(c.w, w_before - 0.1 * (g - sends[0].m + mean))
    assert c.next_action() == Step(3, 2)


def test_paper_sends_before_it_waits():
    """r = K: at step K of round t the client sends m_t, then waits for t - 1 - s."""
    c = DGAClient(DGAConfig(local_steps=3, delay=3), w1())
    _drive_alone(c, lambda a: a == Step(2, 3))
    c.step(grad_t(0, 2, 3, c.w))
    assert c.next_action() == Send(2, c.next_action().m)
    c.sent(2)
    assert c.next_action() == Wait(1)
    # D = 0: the send of round t comes inside step K, before the wait for t itself.
    c = DGAClient(DGAConfig(local_steps=3, delay=0), w1())
    act, sends = _drive_alone(c, lambda a: isinstance(a, Wait))
    assert act == Wait(1)
    assert [s.round for s in sends] == [1]


def test_paper_holds_an_early_average_until_its_step():
    cfg = DGAConfig(local_steps=3, delay=4, lr=0.1)
    held = DGAClient(cfg, w1())
    late = DGAClient(cfg, w1())
    means = {}

    def deliver(act):
        means[act.round] = act.m * 0.25
        if act.round == 1:
            w = held.w.clone()
            assert held.apply_average(1, means[1]) == ()
            assert torch.equal(held.w, w)  # held, not applied

    _drive_alone(held, lambda a: a == Step(3, 2), deliver)
    _, _ = _drive_alone(late, lambda a: isinstance(a, Wait))
    late.apply_average(1, means[1])
    assert torch.allclose(held.w, late.w, atol=1e-15)


def test_a_pipeline_under_way_survives_the_state_file_format():
    """A client with rounds in flight, a held early average and momentum, and a reducer
    with a round half reported, come back exactly from a state file (no pickle) and go
    on as the originals do."""
    cfg = DGAConfig(local_steps=3, delay=4, lr=0.1, momentum=0.9)
    c = DGAClient(cfg, w1(), client=0)
    server = DGAServer(2)
    sent = []

    def deliver(act):
        sent.append(act)
        server.add(act.round, 0, act.m)   # the other client has not reported yet
        if act.round == 1:
            c.apply_average(1, act.m * 0.5)   # early: held until its step

    _drive_alone(c, lambda a: a == Step(2, 2), deliver)
    assert c.state_dict()["held"]
    assert c.state_dict()["pending"]
    assert server.state_dict()["open"]
    for obj in (c, server):
        state = obj.state_dict()
        back = statefile.loads(statefile.encode(state, "client-state").to_bytes(),
                               "client-state")
        assert same_state(back, state)
        assert statefile.encode(back, "x").to_bytes() == statefile.encode(state, "x").to_bytes()
    fresh_c = DGAClient(cfg, torch.zeros(0), client=0)
    fresh_c.load_state_dict(statefile.loads(
        statefile.encode(c.state_dict(), "client-state").to_bytes(), "client-state"))
    fresh_s = DGAServer(2)
    fresh_s.load_state_dict(statefile.loads(
        statefile.encode(server.state_dict(), "checkpoint").to_bytes(), "checkpoint"))
    for a, b in ((c, fresh_c), (server, fresh_s)):
        assert same_state(a.state_dict(), b.state_dict())
    means = [reducer.add(1, 1, sent[0].m * 3.0) for reducer in (server, fresh_s)]
    assert torch.equal(means[0], means[1])
    for client in (c, fresh_c):   # the held average is applied at step (3, 1)
        _drive_alone(client, lambda a: a == Step(3, 3))
    assert same_state(c.state_dict(), fresh_c.state_dict())
    assert not c.state_dict()["held"]
    assert same_state(server.state_dict(), fresh_s.state_dict())


def test_paper_mode_under_latency_follows_algorithm_1_and_stalls():
    """Network timing changes when a paper-mode client steps, never what it computes."""
    K, D, n, rounds = 3, 4, 3, 6
    cfg = DGAConfig(local_steps=K, delay=D, lr=0.1, momentum=0.9, rounds=rounds)
    want = ref.dga(W1, grad_list, n, K, D, rounds, const_lr, beta=0.9)
    for seed, lat in [(0, (1, 2)), (1, (1, 12))]:
        _, seen, _, stalls = simulate(cfg, n, lambda rng, lat=lat: rng.randint(*lat), seed)
        for (i, t, k), w in seen.items():
            step = (t - 1) * K + (k - 1)
            expect = W1 if step == 0 else want[step - 1][i]
            assert torch.allclose(w, torch.tensor(expect, dtype=torch.float64), atol=1e-12)
        assert len(seen) == n * K * rounds
        assert (sum(stalls) > 0) == (lat[1] > D)


# ---------------------------------------------------------------- auto mode


def test_auto_applies_on_arrival_with_the_effective_delay():
    cfg = DGAConfig(local_steps=2, delay=6, lr=0.1, mode="auto")
    c = DGAClient(cfg, w1())
    _, sends = _drive_alone(c, lambda a: a == Step(2, 2))
    w = c.w.clone()
    mean = sends[0].m + 1.0
    (rec,) = c.apply_average(1, mean)
    assert rec == Corrected(round=1, delay=1, c_beta=1.0)
    assert torch.allclose(c.w, w + 0.1 * (sends[0].m - mean))
    assert c.next_action() == Step(2, 2)


def test_auto_blocks_beyond_max_pending():
    cfg = DGAConfig(local_steps=1, delay=1, mode="auto", max_pending=2)
    c = DGAClient(cfg, w1())
    act, sends = _drive_alone(c, lambda a: isinstance(a, Wait))
    assert act == Wait(1)
    assert len(sends) == 3
    with pytest.raises(DGAProtocolError, match=r"'step'.*state='blocked'"):
        c.step(torch.zeros(3, dtype=torch.float64))
    c.apply_average(2, sends[1].m)  # any round frees a slot
    assert isinstance(c.next_action(), Step)


@pytest.mark.parametrize("beta", [0.0, 0.9])
@pytest.mark.parametrize(("D", "lat"), [(3, (0, 2)), (4, (1, 9)), (10, (2, 25))])
def test_auto_mean_invariant_after_all_corrections(D, lat, beta):
    """In auto mode the invariant holds again once every correction is applied."""
    n = 4
    cfg = DGAConfig(local_steps=3, delay=D, lr=0.1, momentum=beta, mode="auto", rounds=6)
    clients, seen, log, _ = simulate(cfg, n, lambda rng: rng.randint(*lat), seed=D)
    assert len(seen) == n * 18
    assert sorted(rec.round for _, rec in log) == sorted(list(range(1, 7)) * n)
    assert len({rec.delay for _, rec in log}) > 2  # D emerges from the network
    # The mean of the models = w_1 - eta/N sum of all directions, whatever the order.
    per_client: list[list[torch.Tensor]] = [[] for _ in range(n)]
    for (i, t, k), w in sorted(seen.items()):
        per_client[i].append(grad_t(i, t, k, w))
    total = torch.zeros(3, dtype=torch.float64)
    for i in range(n):
        u = torch.zeros(3, dtype=torch.float64)
        for g in per_client[i]:
            u = beta * u + g
            total += u
    wbar = w1() - 0.1 / n * total
    final = DGAServer.final_average([c.w for c in clients])
    assert torch.allclose(final, wbar, atol=1e-12)
    if beta == 0.0:  # every round's correction applied: all clients hold wbar
        for c in clients:
            assert torch.allclose(c.w, wbar, atol=1e-12)


def test_auto_out_of_order_averages_are_harmless():
    cfg = DGAConfig(local_steps=1, delay=5, lr=0.1, mode="auto")
    a, b = DGAClient(cfg, w1()), DGAClient(cfg, w1())
    _, sa = _drive_alone(a, lambda x: isinstance(x, Step) and x.round == 4)
    _drive_alone(b, lambda x: isinstance(x, Step) and x.round == 4)
    means = {s.round: s.m * 0.3 for s in sa}
    for t in (3, 1, 2):
        a.apply_average(t, means[t])
    for t in (1, 2, 3):
        b.apply_average(t, means[t])
    assert torch.allclose(a.w, b.w, atol=1e-15)


# ---------------------------------------------------------------- R-DG4 variants


def test_no_correction_keeps_clients_identical_and_overwrite_resyncs():
    n, K, D = 3, 3, 4
    _, trace, _ = lockstep(DGAConfig(local_steps=K, delay=D, correction="none"), n, K * 5)
    for ws in trace:
        assert all(torch.equal(w, ws[0]) for w in ws)
    _, trace, _ = lockstep(DGAConfig(local_steps=K, delay=D, correction="overwrite"), n, K * 5)
    for step, ws in enumerate(trace):
        t, k = step // K + 1, step % K + 1
        resync = k == 1 and t >= 3  # r = 1, s = 1
        assert all(torch.equal(w, ws[0]) for w in ws) == resync


@pytest.mark.parametrize(("K", "D"), [(3, 4), (5, 20), (2, 2)])
@pytest.mark.parametrize("beta", [0.0, 0.9])
def test_no_correction_per_step_is_delayed_average_sgd_one_share_a_step(K, D, beta):
    """R-DG4 step by step: the own direction is never applied; from the correction
    point of round t0 (D steps after it was sent) each of the next K steps moves w by
    eta mbar_t0 / K. Clients stay identical, and no step moves by more than one share
    (no once-per-round jump)."""
    n, rounds = 3, 8
    cfg = DGAConfig(local_steps=K, delay=D, correction="none_per_step", momentum=beta)
    _, trace, dirs = lockstep(cfg, n, K * rounds)
    for ws in trace:
        assert all(torch.equal(w, ws[0]) for w in ws)
    # the expected model, step by step: round t's mean direction, 1/K a step, from
    # step t K + D on (1-based step numbers; round t's own steps are (t-1) K + 1 .. t K)
    mean_dir = [sum(torch.stack(dirs[j]).mean(0) for j in range((t - 1) * K, t * K))
                for t in range(1, rounds + 1)]
    w = w1()
    shares: list[list] = []
    for step in range(1, K * rounds + 1):
        if step > D and (step - D) % K == 0:        # the correction point of round t0
            shares.append([mean_dir[(step - D) // K - 1] / K, K])
        if shares:
            w = w - const_lr(0, 0) * shares[0][0]
            shares[0][1] -= 1
            if shares[0][1] == 0:
                shares.pop(0)
        assert torch.allclose(trace[step - 1][0], w, atol=1e-12), step
    # nothing moves in the first D steps: no average is due yet, and the own step is not taken
    assert all(torch.equal(trace[j][0], w1()) for j in range(D))


def test_no_correction_per_step_drains_every_share_at_the_end():
    cfg = DGAConfig(local_steps=2, delay=3, correction="none_per_step", rounds=4)
    clients, _, _ = lockstep(cfg, 2, 8)
    server = DGAServer(2)
    for i, c in enumerate(clients):   # the last averages arrive after the last step
        while isinstance(act := c.next_action(), Send):
            mean = server.add(act.round, i, act.m)
            c.sent(act.round)
            if mean is not None:
                for other in clients:
                    other.apply_average(act.round, mean)
    assert all(isinstance(c.next_action(), Done) for c in clients)
    assert all(not c._queue for c in clients)
    assert torch.equal(clients[0].w, clients[1].w)


# ---------------------------------------------------------------- illegal events


def _blocked_client():
    c = DGAClient(DGAConfig(local_steps=2, delay=2), w1())  # s = 0, r = 2
    act, sends = _drive_alone(c, lambda a: isinstance(a, Wait))
    assert act == Wait(1)
    return c, sends


def test_illegal_events_name_event_client_and_state():
    c, sends = _blocked_client()
    snap = c.state_dict()
    with pytest.raises(
        DGAProtocolError,
        match=r"can't handle event 'step'.*client=0 and state='blocked'.*Wait\(round=1\)",
    ):
        c.step(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(DGAProtocolError, match=r"'average' \(round 7\).*never sent"):
        c.apply_average(7, sends[0].m)
    with pytest.raises(DGAProtocolError, match=r"'average' \(round 0\).*never sent"):
        c.apply_average(0, sends[0].m)
    with pytest.raises(DGAProtocolError, match=r"'sent' \(round 3\).*nothing to send"):
        c.sent(3)
    with pytest.raises(ValueError, match="shape"):
        c.apply_average(1, torch.zeros(2, dtype=torch.float64))
    with pytest.raises(NonFiniteUpdate, match="non-finite"):
        c.apply_average(1, torch.tensor([0.0, float("nan"), 0.0], dtype=torch.float64))
    c.apply_average(2, sends[1].m)  # early: held
    with pytest.raises(DGAProtocolError, match=r"round 2.*already arrived"):
        c.apply_average(2, sends[1].m)
    c.apply_average(1, sends[0].m)
    with pytest.raises(DGAProtocolError, match=r"round 1.*already applied"):
        c.apply_average(1, sends[0].m)
    assert not same_state(snap, c.state_dict())


def test_unsent_rounds_and_bad_gradients():
    c = DGAClient(DGAConfig(local_steps=1, delay=3), w1())
    c.step(grad_t(0, 1, 1, c.w))
    snap = c.state_dict()
    with pytest.raises(DGAProtocolError, match=r"'step'.*Send\(round=1"):
        c.step(grad_t(0, 2, 1, c.w))
    with pytest.raises(DGAProtocolError, match=r"call sent\(1\) first"):
        c.apply_average(1, torch.zeros(3, dtype=torch.float64))
    with pytest.raises(DGAProtocolError, match=r"'sent' \(round 2\).*round 1 is next"):
        c.sent(2)
    c.sent(1)
    with pytest.raises(NonFiniteUpdate, match="gradient"):
        c.step(torch.tensor([1.0, float("inf"), 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        c.step(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"Invalid lr: -1"):
        c.step(torch.zeros(3, dtype=torch.float64), lr=-1)
    snap["outbox"] = []
    assert same_state(snap, c.state_dict())  # rejected events change nothing
    with pytest.raises(ValueError, match="Invalid w0"):
        DGAClient(DGAConfig(), torch.zeros(3, dtype=torch.int64))


def test_drain_then_done_accepts_nothing():
    c = DGAClient(DGAConfig(local_steps=2, delay=3, rounds=3), w1())  # s = 1, r = 1
    own = {}
    while not isinstance(act := c.next_action(), Done):
        if isinstance(act, Send):
            own[act.round] = act.m
            c.sent(act.round)
        elif isinstance(act, Step):
            c.step(grad_t(0, act.round, act.k, c.w))
        else:  # a one-client reducer: the average is the client's own m
            assert (act.round, c.state) in {(1, "blocked"), (2, "draining"), (3, "draining")}
            c.apply_average(act.round, own[act.round])
    assert c.state == "done"
    assert c.steps == 6
    with pytest.raises(DGAProtocolError, match=r"'step'.*state='done'"):
        c.step(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(DGAProtocolError, match=r"'average'.*state='done'"):
        c.apply_average(1, torch.zeros(3, dtype=torch.float64))


def test_transition_table_is_closed():
    for state, events in CLIENT_TRANSITIONS.items():
        for event, targets in events.items():
            assert event in {"step", "average", "sent"}, (state, event)
            assert set(targets) <= CLIENT_TRANSITIONS.keys()


def test_client_state_dict_round_trip_mid_flight():
    client, sends = _blocked_client()  # blocked with a stashed step
    fresh = DGAClient(client.config, torch.zeros(3, dtype=torch.float64))
    fresh.load_state_dict(copy.deepcopy(client.state_dict()))
    assert same_state(fresh.state_dict(), client.state_dict())
    for x in (client, fresh):
        x.apply_average(2, sends[1].m)  # held
        x.apply_average(1, sends[0].m * 0.5)  # completes the stashed step
        _drive_alone(x, lambda a: a == Step(4, 1))
    assert same_state(fresh.state_dict(), client.state_dict())
    cfg = DGAConfig(local_steps=2, delay=3, momentum=0.9, mode="auto")
    m = DGAClient(cfg, w1())
    _drive_alone(m, lambda a: a == Step(3, 1))
    fresh = DGAClient(cfg, w1())
    fresh.load_state_dict(m.state_dict())
    assert same_state(fresh.state_dict(), m.state_dict())


# ---------------------------------------------------------------- reducer


def test_server_reduces_per_round_and_rejects_duplicates():
    s = DGAServer(3)
    m = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 0.0]), torch.tensor([-1.0, 1.0])]
    assert s.add(2, 0, m[0]) is None
    assert s.add(1, 1, m[1]) is None  # rounds interleave
    with pytest.raises(DGAProtocolError, match=r"client 0 already reported"):
        s.add(2, 0, m[0])
    saved = copy.deepcopy(s.state_dict())
    assert s.add(2, 1, m[1]) is None
    out = s.add(2, 2, m[2])
    assert torch.equal(out, torch.tensor([1.0, 1.0]))
    assert out.dtype == torch.float32
    with pytest.raises(DGAProtocolError, match=r"round=2 and state='complete'"):
        s.add(2, 1, m[1])
    fresh = DGAServer(3)
    fresh.load_state_dict(saved)
    fresh.add(2, 1, m[1])
    assert torch.equal(fresh.add(2, 2, m[2]), out)


def test_server_validation():
    s = DGAServer()
    with pytest.raises(ValueError, match="Invalid expected: None"):
        s.add(0, 0, torch.zeros(2))
    s.add(0, 0, torch.zeros(2), expected=2)
    with pytest.raises(ValueError, match=r"Invalid expected: 3 \(round 0 expects 2\)"):
        s.add(0, 1, torch.zeros(2), expected=3)
    with pytest.raises(ValueError, match="shape"):
        s.add(0, 1, torch.zeros(3), expected=2)
    with pytest.raises(NonFiniteUpdate, match="non-finite"):
        s.add(0, 1, torch.tensor([0.0, float("inf")]), expected=2)
    with pytest.raises(ValueError, match="Invalid round_id: -1"):
        s.add(-1, 1, torch.zeros(2), expected=2)
    assert s.state_dict()["open"][0]["clients"] == [0]


def test_final_average_is_the_plain_mean():
    ws = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0])]
    assert torch.equal(DGAServer.final_average(ws), torch.tensor([2.0, 4.0]))
    assert ref.final_average([[1.0, 2.0], [3.0, 6.0]]) == [2.0, 4.0]


def test_the_client_optimizers_weight_decay_reaches_dgas_gradient():
    """``client.weight_decay`` under DGA: each step's gradient is ``g + wd * w``, as
    torch.optim.SGD adds it before the momentum (it was read by no one before)."""
    from fedsim.algorithms.api import ClientContext
    from fedsim.algorithms.dga import DGAClientWork, DGAScenarioConfig, dga_config
    from fedsim.algorithms.local import LocalConfig
    from fedsim.algorithms.optim import SGDMOptions

    local = LocalConfig(optimizer=SGDMOptions(lr=0.1, momentum=0.5, weight_decay=0.01))
    cfg = dga_config(DGAScenarioConfig(name="dga", local_steps=2, delay=1), local)
    assert (cfg.lr, cfg.momentum, cfg.weight_decay) == (0.1, 0.5, 0.01)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    w = torch.randn(8)
    idx = torch.arange(8)
    g0, loss0 = DGAClientWork(cfg.model_copy(update={"weight_decay": 0.0}), 1,
                              ClientContext(model=model, local=local, seed=0))._grad(w, x, y, idx)
    g, loss = DGAClientWork(cfg, 1, ClientContext(model=model, local=local, seed=0))._grad(
        w, x, y, idx)
    assert loss == loss0
    torch.testing.assert_close(g, g0 + 0.01 * w)
