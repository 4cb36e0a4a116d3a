r"""FedSpeed: prox term, prox-correction and gradient perturbation (client and server).

Sun, Huang, Shen, Ding and Tao, "FedSpeed: Larger Local Interval, Less
Communication Round, and Higher Generalization Accuracy" (ICLR 2023,
https://arxiv.org/abs/2302.10429). The choices fedsim made (the ``R-FS`` ids
and where the authors' code differs) are in docs/algorithms.md#fedspeed.

Client ``i`` from ``x^t``, for ``k = 0 .. K-1``, one minibatch ``eps`` a step::

    g1     = grad F_i(x; eps)
    rho_k  = rho0 / (||g1|| + 1e-7)           (normalized; or a constant rho, R-FS3)
    g2     = grad F_i(x + rho_k g1; eps)      (same minibatch, same dropout mask)
    gtilde = (1 - alpha) g1 + alpha g2        (quasi-gradient, R-FS1)
    x      = x - eta_l (gtilde - ghat_i + (1/lambda)(x - x^t) + wd x)

then ``ghat_i <- ghat_i - (1/lambda)(x_K - x^t)`` (persistent, model-sized,
zero before the first participation) and the upload is the amended model
``xhat_i = x_K - lambda * ghat_i`` with the *updated* ``ghat_i``. The server
averages the uploads with the plain mean over the round's clients
(Algorithm 1, line 16). Each module (prox term, prox-correction,
perturbation) has a switch for the paper's Table 7 ablation; with all three
off the client is plain local SGD and the server plain FedAvg.

``g1`` is the pure loss gradient: prox, correction and weight decay enter only
the descent (docs/algorithms.md#fedspeed-ascent-uses-the-loss-gradient-only).
The ascent pass restores the model's buffers (BatchNorm statistics) and replays
the first pass's global CPU/CUDA RNG state, so dropout masks match; it draws
nothing new from global random state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

from pydantic import StrictBool, model_validator

from fedsim.algorithms._kernels import (
    check_round,
    check_shape,
    flatten,
    pack_tensor,
    unflatten,
    unpack_tensor,
)
from fedsim.algorithms.api import (
    AlgorithmSpec,
    ClientAlgorithm,
    ClientContext,
    Outcome,
    ServerContext,
)
from fedsim.algorithms.fedavg import fedavg_aggregate
from fedsim.algorithms.flows import RoundRule, RoundsConfig, RoundsFlow
from fedsim.algorithms.local import LocalConfig, batches, load_vector
from fedsim.algorithms.optim import fixed_lr, make_optimizer
from fedsim.lazy import lazy_module
from fedsim.schema import FiniteNonNeg, FinitePos, Pos, Prob, SchemaModel
from fedsim.wire.messages import Task, Update

if TYPE_CHECKING:
    import torch
    from torch import nn
else:
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")

__all__ = [
    "SPEC",
    "FedSpeedClient",
    "FedSpeedConfig",
    "FedSpeedKeys",
    "FedSpeedScenarioConfig",
    "FedSpeedServer",
    "ascent_scale",
    "fedspeed_amend",
    "fedspeed_direction_",
    "fedspeed_local_train",
    "quasi_gradient",
]

AscentMode = Literal["normalized", "constant"]
ASCENT_MODES: tuple[str, ...] = get_args(AscentMode)


def _require(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"Invalid {name}: {value} ({rule})")


def _allowed(name: str, value: object, allowed: Sequence[str]) -> None:
    _require(value in allowed, name, repr(value), f"allowed: {', '.join(allowed)}")


class FedSpeedKeys(SchemaModel):
    """FedSpeed's client hyperparameters and module switches, declared once: the
    ``[algorithm]`` table (:class:`FedSpeedScenarioConfig`) and the client's own
    config (:class:`FedSpeedConfig`) both take them from here.

    Attributes
    ----------
    prox_lambda : float
        ``lambda`` (> 0): the prox weight is ``1/lambda`` (R-FS4: the paper's
        "prox weight 0.1" is ``lambda = 10``); also scales the correction.
    perturb_alpha : float
        Weight ``alpha`` in [0, 1] of the ascent gradient in the quasi-gradient
        (paper 0.9375; the authors' code hard-wires 1,
        docs/algorithms.md#fedspeed-perturbation-weight-paper-not-code).
    ascent_rho : float
        ``rho0`` (``normalized``) or ``rho`` (``constant``), >= 0; not decayed.
    ascent_mode : {"normalized", "constant"}
        ``rho0 / (||g1|| + ascent_eps)`` as in the experiments, or Algorithm 1's
        constant ``rho`` (R-FS3).
    prox, correction, perturbation : bool
        Table 7 switches: the ``(1/lambda)(x - x^t)`` term; the persistent
        ``ghat_i`` with the amended upload; the ascent step (off means
        ``gtilde = g1``, one gradient per step).
    clip_norm : float or None
        ``None`` (paper) or the authors' ``clip_grad_norm_`` bound (10) on the
        descent direction before weight decay (docs/algorithms.md#fedspeed-no-gradient-clipping).
    """

    prox_lambda: FinitePos = 10.0
    perturb_alpha: Prob = 0.9375
    ascent_rho: FiniteNonNeg = 0.1
    ascent_mode: AscentMode = "normalized"
    prox: StrictBool = True
    correction: StrictBool = True
    perturbation: StrictBool = True
    clip_norm: Pos | None = None


class FedSpeedConfig(FedSpeedKeys):
    """The client's config: :class:`FedSpeedKeys` and what the server rule decides.

    Attributes
    ----------
    ascent_eps : float
        Guard in the ascent's normalization (> 0; 1e-7 as in the authors' ESAM).
    upload : {"amended", "local"}
        Send ``xhat_i`` (paper), or ``x_K`` for a server that keeps
        ``h_i = -lambda ghat_i`` itself (``server_rule = "fl_simulator"``,
        :class:`FedSpeedServer`).
    """

    ascent_eps: FinitePos = 1e-7
    upload: Literal["amended", "local"] = "amended"


# Functional core: the update math over lists of tensors and flat vectors.


def ascent_scale(
    grad_norm: float,
    rho: float,
    mode: str = FedSpeedKeys.model_fields["ascent_mode"].default,
    eps: float = FedSpeedConfig.model_fields["ascent_eps"].default,
) -> float:
    """Step length of the ascent ``xcheck = x + scale * g1`` (C5, R-FS3); ``mode`` and
    ``eps`` default to the config's ``ascent_mode`` and ``ascent_eps``."""
    _allowed("ascent_mode", mode, ASCENT_MODES)
    return rho / (grad_norm + eps) if mode == "normalized" else rho


def quasi_gradient(
    g1: Sequence[torch.Tensor], g2: Sequence[torch.Tensor], alpha: float
) -> list[torch.Tensor]:
    """Return ``(1 - alpha) g1 + alpha g2`` per tensor (C8)."""
    return [torch.lerp(a, b, float(alpha)) for a, b in zip(g1, g2, strict=True)]


def fedspeed_direction_(
    grads: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    anchor: Sequence[torch.Tensor],
    g_hat: Sequence[torch.Tensor] | None,
    inv_lambda: float,
) -> None:
    """Turn ``grads`` (holding ``gtilde``) into C9's descent direction, in place.

    ``gtilde - g_hat + inv_lambda (x - anchor)``; a ``None`` ``g_hat`` or a zero
    ``inv_lambda`` leaves that term out exactly.
    """
    for i, g in enumerate(grads):
        if g_hat is not None:
            g.sub_(g_hat[i])
        if inv_lambda:
            g.add_(params[i].detach() - anchor[i], alpha=inv_lambda)


def fedspeed_amend(
    x_k: torch.Tensor, x0: torch.Tensor, g_hat: torch.Tensor, prox_lambda: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(xhat, ghat_new)`` after a local run (C10, C11), in float64 inside.

    ``ghat_new = g_hat - (x_k - x0) / lambda`` and ``xhat = x_k - lambda ghat_new``
    (= ``x0 + 2 (x_k - x0) - lambda g_hat``, Lemma C.2).
    """
    delta = x_k.to(torch.float64) - x0.to(torch.float64)
    g_new = g_hat.to(torch.float64) - delta / prox_lambda
    x_hat = x_k.to(torch.float64) - prox_lambda * g_new
    return x_hat.to(x_k.dtype), g_new.to(torch.float32)


# Client shell.


def _grads(params: Sequence[nn.Parameter]) -> list[torch.Tensor]:
    """The parameters' ``.grad`` tensors, zeros for unused parameters."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return [p.grad for p in params]  # type: ignore[misc]


#: A saved global RNG state (a string, so importing this module does not import torch).
_RngState: TypeAlias = "tuple[torch.device, torch.Tensor, torch.Tensor | None]"


def _rng_state(device: torch.device) -> _RngState:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return device, torch.get_rng_state(), cuda


@contextmanager
def _replay_rng(state: _RngState) -> Iterator[None]:
    """Run the body from a saved global RNG state, then restore the current one."""
    device, cpu, cuda = state
    with torch.random.fork_rng(devices=[device] if cuda is not None else []):
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)
        yield


def _perturbed_gradient(
    model: nn.Module,
    params: Sequence[nn.Parameter],
    forward: Any,
    cfg: FedSpeedConfig,
    rng: _RngState,
) -> float:
    """Replace the params' grads (``g1``) with ``gtilde``; return the ascent scale."""
    g1 = [g.detach().clone() for g in _grads(params)]
    norms = [torch.linalg.vector_norm(g, dtype=torch.float64) for g in g1]
    norm = float(torch.linalg.vector_norm(torch.stack(norms)))  # float64, one sync
    scale = ascent_scale(norm, cfg.ascent_rho, cfg.ascent_mode, cfg.ascent_eps)
    saved = [p.detach().clone() for p in params]
    buffers = [b.detach().clone() for b in model.buffers()]
    with torch.no_grad():
        for p, g in zip(params, g1, strict=True):
            p.add_(g, alpha=scale)
    for g in _grads(params):
        g.zero_()
    with _replay_rng(rng):
        forward().backward()
    with torch.no_grad():
        for p, x in zip(params, saved, strict=True):
            p.copy_(x)
        for b, s in zip(model.buffers(), buffers, strict=True):
            b.copy_(s)
        grads = _grads(params)
        for g, q in zip(grads, quasi_gradient(g1, grads, cfg.perturb_alpha), strict=True):
            g.copy_(q)
    return scale


def fedspeed_local_train(
    model: nn.Module,
    x0: torch.Tensor,
    data_x: torch.Tensor,
    data_y: torch.Tensor,
    local_cfg: LocalConfig,
    cfg: FedSpeedConfig,
    g_hat: torch.Tensor | None,
    generator: torch.Generator,
    loss_fn: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Run one FedSpeed local round from the global model ``x0 = x^t``.

    ``K = local_cfg.num_steps(n)`` steps of ``local_cfg.batch_size`` with the
    step size ``local_cfg.optimizer.lr``; the direction is handed to a fresh
    ``make_optimizer(local_cfg.optimizer)`` (plain ``sgd`` is the paper; its
    ``weight_decay`` is the descent-only ``wd x``). ``g_hat`` is the client's
    correction from its last participation (``None``: zeros, first time).

    Returns ``(upload, new_g_hat, stats)``: the upload is ``xhat_i`` (or
    ``x_K`` with ``cfg.upload = "local"`` or the correction off); ``new_g_hat``
    is a new float32 vector the client keeps for its next round (unchanged
    when the correction is off); stats hold ``steps``, ``loss`` (mean minibatch
    loss at the descent points), ``samples``, ``grad_evals`` (2 per step with
    the perturbation) and ``ascent_scale`` (mean ``rho_k``).
    """
    n = int(data_x.shape[0])
    if n == 0:
        raise ValueError("Invalid client data: no samples")
    if local_cfg.prox_mu:
        raise ValueError(
            f"Invalid prox_mu: {local_cfg.prox_mu} (FedSpeed has its own prox term; "
            "leave LocalConfig.prox_mu = 0 and set FedSpeedConfig.prox_lambda)"
        )
    lr = fixed_lr(local_cfg.optimizer)
    if cfg.prox and lr > cfg.prox_lambda:
        raise ValueError(
            f"Invalid lr: {lr} > prox_lambda {cfg.prox_lambda} (the local recursion scales "
            "the offset by 1 - lr/lambda; keep lr <= prox_lambda: "
            "docs/algorithms.md#fedspeed-requires-lr-at-most-lambda)"
        )
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    load_vector(model, x0)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    x_start = flatten(params)
    if g_hat is not None:
        check_shape(x_start, g_hat, "g_hat")
    ghat = torch.zeros_like(x_start) if g_hat is None else g_hat.detach().to(x_start).clone()
    anchor = [p.detach().clone() for p in params]
    ghat_views = unflatten(ghat, [tuple(p.shape) for p in params]) if cfg.correction else None
    inv_lambda = 1.0 / cfg.prox_lambda if cfg.prox else 0.0
    opt = make_optimizer(local_cfg.optimizer, params)
    steps = local_cfg.num_steps(n)
    order = batches(n, local_cfg.batch_size, generator)
    total, seen, scales = 0.0, 0, 0.0
    for _ in range(steps):
        idx = next(order)
        xb, yb = data_x[idx], data_y[idx]

        def forward(xb: torch.Tensor = xb, yb: torch.Tensor = yb) -> torch.Tensor:
            out: torch.Tensor = loss_fn(model(xb), yb)
            return out

        opt.zero_grad(set_to_none=False)
        rng = _rng_state(data_x.device) if cfg.perturbation else None
        loss = forward()
        loss.backward()  # type: ignore[no-untyped-call]
        if rng is not None:
            scales += _perturbed_gradient(model, params, forward, cfg, rng)
        with torch.no_grad():
            fedspeed_direction_(_grads(params), params, anchor, ghat_views, inv_lambda)
        if cfg.clip_norm is not None:
            nn.utils.clip_grad_norm_(params, cfg.clip_norm)
        opt.step()
        total += float(loss.detach()) * len(idx)
        seen += len(idx)
    x_k = flatten(params)
    if cfg.correction:
        x_hat, new_ghat = fedspeed_amend(x_k, x_start, ghat, cfg.prox_lambda)
    else:
        x_hat, new_ghat = x_k, ghat
    evals = steps * (2 if cfg.perturbation else 1)
    stats = {"steps": steps, "loss": total / seen, "samples": seen}
    stats |= {"grad_evals": evals, "ascent_scale": scales / steps}
    return (x_hat if cfg.upload == "amended" else x_k), new_ghat, stats


# Server rule.


class FedSpeedScenarioConfig(RoundsConfig, FedSpeedKeys):
    """``[algorithm]`` of FedSpeed: prox-correction + gradient perturbation (Table 7
    switches, :class:`FedSpeedKeys`) and the round's keys, and the server rule."""

    name: Literal["fedspeed"] = "fedspeed"
    #: the server rule as a whole: ``paper`` (Algorithm 1, line 16: the plain mean of
    #: the round's amended uploads ``xhat_i``) or ``fl_simulator`` (the authors'
    #: code: clients upload ``x_K``, the server keeps ``h_i = -lambda ghat_i`` per
    #: client and takes the mean of the round's ``x_K`` plus the mean of ``h_i`` over
    #: *all* ``m`` clients); docs/algorithms.md#fedspeed-server-rule
    server_rule: Literal["paper", "fl_simulator"] = "paper"

    @model_validator(mode="after")
    def _one_rule(self) -> FedSpeedScenarioConfig:
        if self.server_rule != "fl_simulator":
            return self
        if self.weighting != "uniform":
            raise ValueError(
                "server_rule = 'fl_simulator' averages the round's models and every "
                "client's h_i uniformly, as the authors' code does; weighting = "
                f"'{self.weighting}' would mix it with a weighted mean (use 'uniform')")
        # the server's h_i must follow the client's ghat_i: every upload the client
        # made must reach it unchanged (the authors' code keeps h_i on the server only)
        for key, value, why in (
                ("round_deadline", self.round_deadline, "discards late uploads"),
                ("over_selection", self.over_selection or None, "discards the extra uploads"),
                ("guard", self.guard, "clips or rejects uploads")):
            if value is not None:
                raise ValueError(
                    f"server_rule = 'fl_simulator' keeps each client's h_i on the server from "
                    f"its uploads, while the client keeps ghat_i from its own run; {key} "
                    f"{why} after the client counted them, and the two would part (remove "
                    f"{key}, or use server_rule = 'paper')")
        return self

    def client_config(self) -> FedSpeedConfig:
        """The client's hyperparameters (the authors' rule: upload ``x_K``)."""
        return FedSpeedConfig(
            **self.model_dump(include=set(FedSpeedKeys.model_fields)),
            upload="local" if self.server_rule == "fl_simulator" else "amended")


class FedSpeedServer(RoundRule):
    """FedSpeed's server step over one round's uploads.

    It reads ``server_lr`` (``eta_g``; the paper's "global lr 1.0" is plain
    averaging) and ``weighting`` (``uniform``: the paper's plain mean over
    ``S^t``, Algorithm 1, line 16) of ``cfg``, and takes its aggregation
    from ``server_rule``:

    * ``paper``: ``x <- mean_S xhat_i``.
    * ``fl_simulator`` (the authors' code, docs/algorithms.md#fedspeed-server-rule):
      clients upload ``x_K``; the server keeps ``h_i += x_K,i - x``
      (= ``-lambda ghat_i``) for all clients and sets
      ``x <- mean_S x_K + (1/m) sum_all h_i``; equal under full
      participation. Without ``correction`` the ``h_i`` term (the
      correction) goes too, which leaves ``paper``'s plain mean (of ``x_K``).

    ``total_clients`` is ``m``, required by ``fl_simulator``.
    """

    def __init__(self, cfg: FedSpeedScenarioConfig, total_clients: int | None = None) -> None:
        authors = cfg.server_rule == "fl_simulator" and cfg.correction
        self.aggregation: Literal["paper", "fl_simulator"] = "fl_simulator" if authors else "paper"
        m = total_clients
        _require(m is None or m >= 1, "total_clients", m, "must be >= 1")
        _require(
            not authors or m is not None, "total_clients", m,
            "server_rule='fl_simulator' averages h_i over all m clients; pass total_clients=m",
        )  # fmt: skip
        self.cfg = cfg
        self.total_clients = total_clients
        self.rounds = 0
        self._h: dict[int, torch.Tensor] = {}

    def aggregate(
        self, x: torch.Tensor, results: Sequence[Update]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Aggregate one round; invalid or non-finite uploads raise before any change."""
        clients = check_round(x, results, "upload", unique=True)
        if self.aggregation == "paper":
            new = fedavg_aggregate(x, results, self.cfg.server_lr, self.cfg.weighting)
        else:
            new = self._fl_simulator(x, results)
        self.rounds += 1
        return new, {"clients": clients}

    def _fl_simulator(self, x: torch.Tensor, results: Sequence[Update]) -> torch.Tensor:
        h = dict(self._h)
        for r in results:
            step = r.params.to(torch.float64) - x.to(torch.float64)
            h[r.client] = h[r.client] + step if r.client in h else step
        m = int(self.total_clients or 0)
        if len(h) > m:
            raise ValueError(f"Invalid round: {len(h)} distinct clients > total_clients {m}")
        avg = fedavg_aggregate(x, results, 1.0, self.cfg.weighting).to(torch.float64)
        target = avg + torch.stack(list(h.values())).sum(0) / m
        x64 = x.to(torch.float64)
        self._h = h
        return (x64 + self.cfg.server_lr * (target - x64)).to(x.dtype)

    def state_dict(self) -> dict[str, Any]:
        """Return the rule's mutable state (``h_i`` as lists of floats)."""
        shape = next((list(t.shape) for t in self._h.values()), None)
        h = {c: t.reshape(-1).tolist() for c, t in sorted(self._h.items())}
        return {"rounds": self.rounds, "h": h, "shape": shape}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state saved by :meth:`state_dict`."""
        self.rounds = int(state["rounds"])
        shape = state.get("shape") or []
        self._h = {
            int(c): torch.tensor(v, dtype=torch.float64).reshape(shape)
            for c, v in state.get("h", {}).items()
        }


# The algorithm's home: client side, registration.


class FedSpeedClient(ClientAlgorithm):
    """FedSpeed's client side; keeps each client's ``g_hat`` between its rounds."""

    def __init__(self, cfg: FedSpeedConfig, ctx: ClientContext) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.g_hat: dict[int, torch.Tensor] = {}

    def begin(
        self, task: Task, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
    ) -> Outcome:
        local = self.ctx.local.with_work(task.work)
        upload, self.g_hat[task.client], stats = fedspeed_local_train(
            self.ctx.model, task.params, x, y, local, self.cfg, self.g_hat.get(task.client), gen)
        return Outcome(steps=int(stats["steps"]), loss=float(stats["loss"]), upload=upload,
                       notes={"ascent_scale": stats["ascent_scale"]})

    def state_dict(self) -> dict[str, Any]:
        return {"g_hat": {c: pack_tensor(g) for c, g in sorted(self.g_hat.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.g_hat = {int(c): unpack_tensor(g) for c, g in state["g_hat"].items()}


def _server(cfg: FedSpeedScenarioConfig, ctx: ServerContext) -> RoundsFlow:
    return RoundsFlow(FedSpeedServer(cfg, total_clients=ctx.num_clients), cfg, ctx)


SPEC = AlgorithmSpec(
    names=("fedspeed",), config=FedSpeedScenarioConfig, server=_server,
    client=lambda cfg, ctx: FedSpeedClient(cfg.client_config(), ctx),
    summary="quasi-gradient with normalized ascent, prox 1/lambda, persistent g_hat",
    optimizers=("sgd", "sgdm", "adam", "adagrad"))
