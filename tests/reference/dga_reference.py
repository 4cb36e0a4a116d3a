"""DGA, Algorithm 1 of Zhu et al., written out as in docs/algorithms.md#dga.

All N clients run in lockstep on plain Python floats, one coordinate at a
time, exactly as the pseudocode reads (the "paper" mode: every average is
there when it is due, since the reducer runs at the end of each round):

    s = (D - 1) // K ; r = D - s K                                   C2
    for t = 1..T, k = 1..K, each client i:
        g = grad(i, t, k, w_i)                                       C6
        m_t += g              (momentum: u = beta u + g; v_t += u)   C7-C8
        (displacement, R-DG7: M_t += eta_{t,k} d instead)
    after every client's k == K: mbar_t = mean_i m_t^i               R1-R2
    then each client i:
        if k == r and t0 = t - 1 - s >= 1:                           C10
            plain:    w -= eta (g - m_{t0} + mbar_{t0})              C12
            momentum: w -= eta (u - c_beta (v_{t0} - vbar_{t0}))     C13
        else:
            w -= eta d                                               C16

R-DG4 variants: "none" never applies local gradients and sets
w = W = W - eta mbar_{t0} at the correction; "overwrite" applies them, then
sets w = W at the correction. D = 0 (FedAvg mode) uses c_beta = 1.
No fedsim import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Grad = Callable[[int, int, int, list[float]], list[float]]


def c_beta_paper(beta: float, delay: int) -> float:
    """(1 - beta^D) / (1 - beta), and 1 where that is not the rule (D <= 1, beta = 0)."""
    if beta == 0.0 or delay <= 1:
        return 1.0
    total = 0.0
    for j in range(delay):  # the geometric series, summed term by term
        total += beta**j
    return total


def dga(
    w1: Sequence[float],
    grad: Grad,
    n_clients: int,
    local_steps: int,
    delay: int,
    rounds: int,
    lr: Callable[[int, int], float],
    beta: float = 0.0,
    c_beta: float | None = None,
    accumulate: str = "raw",
    correction: str = "full",
) -> list[list[list[float]]]:
    """Run Algorithm 1; return every client's w after every (t, k)."""
    K, D = local_steps, delay
    s = (D - 1) // K  # Python floor division: D = 0 gives s = -1 (R-DG2)
    r = D - s * K
    dim = len(w1)
    w = [list(w1) for _ in range(n_clients)]
    u = [[0.0] * dim for _ in range(n_clients)]
    base = list(w1)  # R-DG4: w_1 - eta sum of the averages applied so far
    own: list[dict[int, list[float]]] = [{} for _ in range(n_clients)]
    mbar: dict[int, list[float]] = {}
    c = c_beta_paper(beta, D) if c_beta is None else c_beta
    if D == 0:  # FedAvg mode uses the plain rule (R-DG2)
        c = 1.0
    trace = []
    for t in range(1, rounds + 1):
        m = [[0.0] * dim for _ in range(n_clients)]
        for k in range(1, K + 1):
            eta = lr(t, k)
            dirs = []
            for i in range(n_clients):
                g = grad(i, t, k, list(w[i]))
                d = []
                for j in range(dim):
                    if beta > 0:
                        u[i][j] = beta * u[i][j] + g[j]
                        d.append(u[i][j])
                    else:
                        d.append(g[j])
                    m[i][j] += d[j] if accumulate == "raw" else eta * d[j]
                dirs.append(d)
            if k == K:  # every client has sent m_t: the reducer averages
                for i in range(n_clients):
                    own[i][t] = list(m[i])
                mbar[t] = [
                    sum(own[i][t][j] for i in range(n_clients)) / n_clients for j in range(dim)
                ]
            t0 = t - 1 - s
            fire = k == r and t0 >= 1
            scale = eta if accumulate == "raw" else 1.0
            if fire and correction != "full":
                for j in range(dim):
                    base[j] -= scale * mbar[t0][j]
            for i in range(n_clients):
                for j in range(dim):
                    if fire and correction == "full":
                        w[i][j] = (
                            w[i][j] - eta * dirs[i][j] + scale * c * (own[i][t0][j] - mbar[t0][j])
                        )
                    elif fire:
                        w[i][j] = base[j]
                    elif correction != "none":
                        w[i][j] -= eta * dirs[i][j]
            trace.append([list(wi) for wi in w])
    return trace


def final_average(ws: Sequence[Sequence[float]]) -> list[float]:
    """C18: wbar = (1/N) sum_i w^i."""
    return [sum(wi[j] for wi in ws) / len(ws) for j in range(len(ws[0]))]
