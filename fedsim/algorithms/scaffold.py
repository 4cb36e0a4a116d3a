r"""SCAFFOLD: stochastic controlled averaging (client and server).

Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning" (ICML 2020,
https://arxiv.org/abs/1910.06378), Algorithm 1 (option II, which the FedSpeed
authors' simulator also runs); docs/algorithms.md#scaffold.

Server control variate ``c`` and client control variates ``c_i`` start at 0::

    client i:  y <- x ;  K times:  y <- y - eta_l (g_i(y) - c_i + c)
               c_i+ <- c_i - c + (x - y) / (K eta_l)        (option II, default)
               c_i+ <- g_i(x)                               (option I: full local gradient)
               send (y_i, delta_c_i = c_i+ - c_i) ;  keep c_i <- c_i+
    server:    x <- x + eta_g mean_S (y_i - x) ;  c <- c + (1/N) sum_S delta_c_i

``algorithm.weighting = "samples"`` weights the server's model mean by the
clients' sample counts (as FedAvg's); the default, ``"uniform"``, is the
paper's plain mean.

The client uploads its model ``y_i`` (``Update.params``, as FedAvg;
``delta_y = y_i - x`` is recovered on the server) and ``delta_c_i``, passed to
:meth:`Scaffold.aggregate` as a list aligned with the results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from fedsim.algorithms._kernels import (
    check_finite,
    check_round,
    check_shape,
    flatten,
    pack_tensor,
    unflatten,
    unpack_tensor,
    weighted_average,
)
from fedsim.algorithms.api import (
    AlgorithmSpec,
    ClientAlgorithm,
    ClientContext,
    Outcome,
    ServerContext,
)
from fedsim.algorithms.flows import RoundRule, RoundsConfig, RoundsFlow
from fedsim.algorithms.local import LocalConfig, batches, load_vector
from fedsim.algorithms.optim import fixed_lr, make_optimizer
from fedsim.lazy import lazy_module
from fedsim.wire.messages import Task, Update

if TYPE_CHECKING:
    import torch
    from torch import nn
else:
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")

__all__ = [
    "CONTROL_OPTIONS",
    "SPEC",
    "Scaffold",
    "ScaffoldClient",
    "ScaffoldConfig",
    "ScaffoldRounds",
    "scaffold_control_update",
    "scaffold_local_train",
    "scaffold_server_step",
]

CONTROL_OPTIONS: tuple[str, ...] = ("II", "I")


# --------------------------------------------------------------------------
# Functional core.


def scaffold_control_update(
    c_i: torch.Tensor,
    c: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    lr: float,
) -> torch.Tensor:
    """Option II: ``c_i - c + (x - y) / (K lr)``, in float64 inside, float32 out."""
    if steps < 1 or not lr > 0:
        raise ValueError(f"Invalid steps/lr: {steps}, {lr} (need steps >= 1, lr > 0)")
    f = torch.float64
    out = c_i.to(f) - c.to(f) + (x.to(f) - y.to(f)) / (steps * lr)
    return out.to(torch.float32)


def scaffold_server_step(
    x: torch.Tensor,
    c: torch.Tensor,
    ys: Sequence[torch.Tensor],
    delta_cs: Sequence[torch.Tensor],
    server_lr: float,
    total_clients: int,
    weights: Sequence[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(x + eta_g mean(y_i - x), c + sum(delta_c_i) / N)``.

    With ``eta_g = 1`` the new model is ``mean(y_i)`` computed directly.
    ``weights`` (e.g. sample counts) weight the model mean; None: the plain
    mean (the paper's). The control variate's step is always the paper's.
    """
    avg = weighted_average(list(ys), [1.0] * len(ys) if weights is None else list(weights))
    new_x = avg if server_lr == 1.0 else x + server_lr * (avg - x)
    acc = c.to(torch.float64).clone()
    for d in delta_cs:
        acc.add_(d.to(torch.float64), alpha=1.0 / total_clients)
    return new_x, acc.to(c.dtype)


# --------------------------------------------------------------------------
# Client shell.


def _grads(params: Sequence[nn.Parameter]) -> list[torch.Tensor]:
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return [p.grad for p in params]  # type: ignore[misc]


def _full_gradient(
    model: nn.Module,
    params: Sequence[nn.Parameter],
    loss_fn: nn.Module,
    data_x: torch.Tensor,
    data_y: torch.Tensor,
    batch_size: int,
) -> torch.Tensor:
    """Option I's ``g_i(x)``: the mean-loss gradient over all local data.

    Chunks of ``batch_size`` are weighted by their size (``loss_fn`` must
    average over its batch); model buffers are restored afterwards.
    """
    n = int(data_x.shape[0])
    buffers = [b.detach().clone() for b in model.buffers()]
    for g in _grads(params):
        g.zero_()
    for start in range(0, n, batch_size):
        xb, yb = data_x[start : start + batch_size], data_y[start : start + batch_size]
        (loss_fn(model(xb), yb) * (len(xb) / n)).backward()
    out = flatten(_grads(params))
    with torch.no_grad():
        for b, s in zip(model.buffers(), buffers, strict=True):
            b.copy_(s)
        for g in _grads(params):
            g.zero_()
    return out


def scaffold_local_train(
    model: nn.Module,
    x0: torch.Tensor,
    c_global: torch.Tensor | None,
    c_i: torch.Tensor | None,
    data_x: torch.Tensor,
    data_y: torch.Tensor,
    local_cfg: LocalConfig,
    generator: torch.Generator,
    loss_fn: nn.Module | None = None,
    *,
    option: Literal["II", "I"] = "II",
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Run one SCAFFOLD local round from the server model ``x0``.

    ``c_global`` is the server's ``c`` sent with ``x0``; ``c_i`` the client's own
    control variate from its last participation (``None``: zeros). Each of the
    ``K = local_cfg.num_steps(n)`` steps feeds ``g + c - c_i`` (plus
    ``LocalConfig.prox_mu``'s term, if set) to a fresh
    ``make_optimizer(local_cfg.optimizer)``; plain ``sgd`` is the paper, and
    option II divides by ``K * local_cfg.optimizer.lr`` whatever the optimizer.

    Returns ``(y_i, new_c_i, stats)``: the local model, the client's new
    control variate (float32; the client keeps it, and uploads
    ``new_c_i - c_i``), and ``steps``, ``loss``, ``samples``, ``grad_evals``.
    """
    if option not in CONTROL_OPTIONS:
        raise ValueError(f"Invalid option: {option!r} (allowed: {', '.join(CONTROL_OPTIONS)})")
    n = int(data_x.shape[0])
    if n == 0:
        raise ValueError("Invalid client data: no samples")
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    load_vector(model, x0)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    x_start = flatten(params)
    c = _control(c_global, x_start, "c_global")
    ci = _control(c_i, x_start, "c_i")
    shapes = [tuple(p.shape) for p in params]
    correction = None
    if c_global is not None or c_i is not None:
        correction = unflatten(c - ci, shapes)
    anchor = [p.detach().clone() for p in params] if local_cfg.prox_mu > 0 else None
    full_grad = None
    if option == "I":
        full_grad = _full_gradient(model, params, loss_fn, data_x, data_y, local_cfg.batch_size)
    opt = make_optimizer(local_cfg.optimizer, params)
    steps = local_cfg.num_steps(n)
    order = batches(n, local_cfg.batch_size, generator)
    total, seen = 0.0, 0
    for _ in range(steps):
        idx = next(order)
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(data_x[idx]), data_y[idx])
        loss.backward()
        with torch.no_grad():
            for i, g in enumerate(_grads(params)):
                if correction is not None:
                    g.add_(correction[i])
                if anchor is not None:
                    g.add_(params[i] - anchor[i], alpha=local_cfg.prox_mu)
        opt.step()
        total += float(loss.detach()) * len(idx)
        seen += len(idx)
    y = flatten(params)
    if full_grad is None:
        new_ci = scaffold_control_update(ci, c, x_start, y, steps,
                                         fixed_lr(local_cfg.optimizer))
    else:
        new_ci = full_grad
    stats = {
        "steps": steps,
        "loss": total / seen,
        "samples": seen,
        "grad_evals": steps + (1 if full_grad is not None else 0),
    }
    return y, new_ci, stats


def _control(v: torch.Tensor | None, like: torch.Tensor, what: str) -> torch.Tensor:
    if v is None:
        return torch.zeros_like(like)
    check_shape(like, v, what)
    return v.detach().to(device=like.device, dtype=torch.float32)


# --------------------------------------------------------------------------
# Server rule.


class ScaffoldConfig(RoundsConfig):
    """``[algorithm]`` of SCAFFOLD: control variates, option II (or I).

    The server reads ``server_lr`` (``eta_g``; 1 = plain model averaging) and
    ``weighting``: the model mean, plain (the paper's Algorithm 1) or
    weighted by each client's sample count, as FedAvg's (``c`` moves the
    same either way).
    """

    name: Literal["scaffold"] = "scaffold"
    option: Literal["I", "II"] = "II"


class Scaffold:
    """SCAFFOLD's server: averages the models and holds the control variate ``c``.

    Parameters
    ----------
    cfg : ScaffoldConfig
        ``server_lr`` and ``weighting``.
    total_clients : int
        ``N``, the number of clients (``c`` moves by ``|S|/N`` of the mean
        ``delta_c``).

    ``c`` starts at zeros shaped like the first model it sees; send
    :meth:`control` with every task.
    """

    def __init__(self, cfg: ScaffoldConfig, *, total_clients: int) -> None:
        if isinstance(total_clients, bool) or not (
            isinstance(total_clients, int) and total_clients >= 1
        ):
            raise ValueError(f"Invalid total_clients: {total_clients} (must be an int >= 1)")
        self.cfg = cfg
        self.total_clients = total_clients
        self.rounds = 0
        self._c: torch.Tensor | None = None

    def control(self, x: torch.Tensor) -> torch.Tensor:
        """The server control variate ``c`` to send with ``x`` (a copy)."""
        if self._c is None:
            return torch.zeros_like(x)
        check_shape(x, self._c, "control variate")
        return self._c.clone()

    def aggregate(
        self,
        x: torch.Tensor,
        results: Sequence[Update],
        delta_c: Sequence[torch.Tensor],
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Aggregate one round; ``delta_c[j]`` belongs to ``results[j]``.

        Invalid or non-finite inputs raise before ``c`` or the round count change.
        """
        clients = check_round(x, results, unique=True)
        if len(delta_c) != len(results):
            raise ValueError(
                f"Invalid delta_c: {len(delta_c)} control updates for {len(results)} results"
            )
        if len(clients) > self.total_clients:
            raise ValueError(
                f"Invalid round: {len(clients)} clients > total_clients {self.total_clients}"
            )
        for r, d in zip(results, delta_c, strict=True):
            check_shape(x, d, f"delta_c from client {r.client}")
            check_finite(d, f"delta_c from client {r.client}")
        new_x, new_c = scaffold_server_step(
            x,
            self.control(x),
            [r.params for r in results],
            delta_c,
            self.cfg.server_lr,
            self.total_clients,
            None if self.cfg.weighting == "uniform" else [float(r.num_samples) for r in results],
        )
        self._c = new_c
        self.rounds += 1
        return new_x, {"clients": clients}

    def state_dict(self) -> dict[str, Any]:
        """Return the rule's mutable state (``c`` as a list of floats)."""
        c = self._c
        return {
            "rounds": self.rounds,
            "c": None if c is None else c.reshape(-1).tolist(),
            "shape": None if c is None else list(c.shape),
            "dtype": None if c is None else str(c.dtype).removeprefix("torch."),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state saved by :meth:`state_dict`."""
        self.rounds = int(state["rounds"])
        if state.get("c") is None:
            self._c = None
            return
        dtype = getattr(torch, state["dtype"])
        self._c = torch.tensor(state["c"], dtype=dtype).reshape(state["shape"])


# --------------------------------------------------------------------------
# The algorithm's home: a task carries (x, c), an update (y_i, delta_c_i),
# each as two model-sized vectors back to back.


class ScaffoldRounds(RoundRule):
    """:class:`Scaffold` as a round rule over (model, control variate) payloads."""

    def __init__(self, cfg: ScaffoldConfig, total_clients: int) -> None:
        self.rule = Scaffold(cfg, total_clients=total_clients)

    def payload(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.rule.control(x).to(x.dtype)])

    def aggregate(
        self, x: torch.Tensor, results: Sequence[Update]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        n = x.numel()
        for r in results:
            if r.params.numel() != 2 * n:
                raise ValueError(f"Invalid upload from client {r.client}: "
                                 f"{r.params.numel()} values, expected 2 x {n}")
        ys = [r.with_params(r.params[:n]) for r in results]
        return self.rule.aggregate(x, ys, [r.params[n:] for r in results])

    def state_dict(self) -> dict[str, Any]:
        return self.rule.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rule.load_state_dict(state)


class ScaffoldClient(ClientAlgorithm):
    """SCAFFOLD's client side; keeps each client's ``c_i`` between its rounds."""

    def __init__(self, option: Literal["I", "II"], ctx: ClientContext) -> None:
        self.option = option
        self.ctx = ctx
        self.c: dict[int, torch.Tensor] = {}

    def begin(
        self, task: Task, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
    ) -> Outcome:
        local = self.ctx.local.with_work(task.work)
        n = task.params.numel() // 2
        w, c_global = task.params[:n], task.params[n:]
        c_old = self.c.get(task.client)
        y_i, c_new, stats = scaffold_local_train(
            self.ctx.model, w, c_global, c_old, x, y, local, gen, option=self.option)
        delta_c = c_new - (c_old if c_old is not None else torch.zeros_like(c_new))
        self.c[task.client] = c_new
        upload = torch.cat([y_i.to(torch.float32), delta_c.to(torch.float32)])
        return Outcome(steps=int(stats["steps"]), loss=float(stats["loss"]), upload=upload)

    def state_dict(self) -> dict[str, Any]:
        return {"c": {k: pack_tensor(v) for k, v in sorted(self.c.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.c = {int(k): unpack_tensor(v) for k, v in state["c"].items()}


def _server(cfg: ScaffoldConfig, ctx: ServerContext) -> RoundsFlow:
    return RoundsFlow(ScaffoldRounds(cfg, ctx.num_clients), cfg, ctx)


SPEC = AlgorithmSpec(
    names=("scaffold",), config=ScaffoldConfig, server=_server,
    client=lambda cfg, ctx: ScaffoldClient(cfg.option, ctx),
    summary="control variates (option II; I as option); tasks carry (x, c), "
            "updates (y_i, delta c_i)",
    task_copies=2, update_copies=2, optimizers=("sgd", "sgdm", "adam", "adagrad"))
