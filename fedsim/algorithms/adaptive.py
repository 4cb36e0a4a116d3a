r"""Adaptive client optimizers: Delta-SGD and SPS.

docs/algorithms.md#delta-sgd and docs/algorithms.md#sps say what they do and
which choices fedsim made.

Functional core
    :func:`deltasgd_step_size` and :func:`sps_step_size` map plain floats
    (norms, losses, the previous step) to the next step size.
Thin shells
    :class:`DeltaSGD` and :class:`SPS` are ``torch.optim.Optimizer``
    subclasses that gather those floats from the parameters and apply
    ``y <- y - eta * d``. Both take ``step(closure)`` (the pattern of
    ``torch.optim.LBFGS``): Delta-SGD evaluates a second gradient on the same
    minibatch, SPS needs the loss value. The closure zeroes the gradients,
    evaluates the local objective on the current minibatch at the current
    parameters, back-propagates and returns the objective's value.

The step size is global: every norm is over the whole flattened vector of
trainable parameters, accumulated in float64 (docs/algorithms.md#the-model-vector). A
fresh optimizer is built for every local run, so step sizes reset every round
(docs/algorithms.md#client-optimizers-are-fresh-for-every-task).
Each optimizer logs the step sizes it used in ``step_sizes``.

This module imports torch when it is imported (its classes derive from
``torch.optim.Optimizer``), so only code that trains imports it, inside the
function that builds or inspects an optimizer (:func:`~fedsim.algorithms.optim.make_optimizer`,
:func:`~fedsim.algorithms.local.local_train`): the client hosts, which parse
the optimizer's config but never train, stay torch-free
(docs/architecture.md#processes). The scenario's values are checked before
they get here, by the optimizers' config models (:mod:`fedsim.algorithms.optim`);
these classes check their own arguments as ``torch.optim``'s do, for direct use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from fedsim.algorithms.base import StepOverflow

__all__ = [
    "SPS", "AdaptiveStepOptimizer", "DeltaSGD", "deltasgd_step_size", "sps_step_size",
    "step_size_stats",
]  # fmt: skip

#: Delta-SGD's ``first_step``, ``batch_mode`` and ``mask_mode`` (docs/algorithms.md#delta-sgd).
FIRST_STEPS = ("paper", "code")
BATCH_MODES = ("same", "previous")
MASK_MODES = ("independent", "shared")
#: SPS's ``mode`` (docs/algorithms.md#sps).
SPS_MODES = ("constant", "smooth")


def check_positive(name: str, value: float, *, allow_inf: bool = False) -> None:
    """Raise ValueError unless ``value > 0`` (and finite unless ``allow_inf``)."""
    if not value > 0 or (not allow_inf and math.isinf(value)):
        rule = "must be > 0; inf allowed" if allow_inf else "must be finite and > 0"
        raise ValueError(f"Invalid {name}: {value} ({rule})")


def check_nonnegative(name: str, value: float) -> None:
    """Raise ValueError unless ``0 <= value < inf``."""
    if not 0 <= value < math.inf:
        raise ValueError(f"Invalid {name}: {value} (must be finite and >= 0)")


def check_finite(name: str, value: float) -> None:
    """Raise ValueError unless ``value`` is a finite number."""
    if not math.isfinite(value):
        raise ValueError(f"Invalid {name}: {value} (must be finite)")


def check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    """Raise ValueError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"Invalid {name}: {value!r} (allowed: {', '.join(allowed)})")


def check_count(name: str, value: int) -> None:
    """Raise ValueError unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Invalid {name}: {value} (must be an integer >= 1)")


SPS_SMOOTH_BASE = 2.0  # the official smooth_iter grows by 2^(1/n_b) per step


# --------------------------------------------------------------------- functional core


def deltasgd_step_size(
    dx_norm: float, dg_norm: float, eta_prev: float, theta_prev: float, *,
    gamma: float = 2.0, delta: float = 0.1, eps: float = 1e-8, eta_max: float = math.inf,
) -> tuple[float, float]:  # fmt: skip
    r"""Delta-SGD's next step size and ratio (docs/algorithms.md#delta-sgd-guards).

    .. math::
        \eta_k = \min\Big(\frac{\gamma\|x_k - x_{k-1}\|}{2\|g_k - g_{k-1}\|},
                 \sqrt{1 + \delta\theta_{k-1}}\,\eta_{k-1}\Big) + \epsilon,
        \qquad \theta_k = \eta_k / \eta_{k-1}

    The curvature term (and ``eps``) applies only when both norms are > 0;
    otherwise the step is the growth term alone, so ``eta`` never reaches 0.
    A non-finite result (``theta_prev = inf`` with no curvature estimate)
    keeps ``eta_prev``. ``eta_max`` caps the result (default: no cap).

    Returns ``(eta_k, theta_k)``.
    """
    growth = eta_prev if delta == 0 else math.sqrt(1.0 + delta * theta_prev) * eta_prev
    if dx_norm > 0 and dg_norm > 0:
        eta = min(gamma * dx_norm / (2.0 * dg_norm), growth) + eps
    else:
        eta = growth
    if not math.isfinite(eta):
        eta = eta_prev
    eta = min(eta, eta_max)
    return eta, eta / eta_prev


def sps_step_size(
    loss: float, grad_sq_norm: float, *, c: float = 0.5, f_star: float = 0.0,
    eps: float = 1e-8, eta_max: float = math.inf, eta_prev: float | None = None,
    growth: float = 1.0,
) -> float:  # fmt: skip
    r"""Stochastic Polyak step size (Loizou et al. 2021, https://arxiv.org/abs/2002.10542).

    .. math::
        \eta = \min\Big(\frac{f_i(x) - f_i^*}{c\|\nabla f_i(x)\|^2 + \epsilon},
               \eta_{\max}\Big)

    With ``eta_prev`` (the ``smooth`` mode) the step is also capped by
    ``growth * eta_prev``. Guards: a zero gradient, or a loss at or below
    ``f_star``, gives step 0 (the official code's ``loss < fstar`` rule).
    """
    if grad_sq_norm == 0 or loss - f_star <= 0:
        return 0.0
    eta = (loss - f_star) / (c * grad_sq_norm + eps)
    if eta_prev is not None:
        eta = min(eta, growth * eta_prev)
    return min(eta, eta_max)


def step_size_stats(step_sizes: Sequence[float]) -> dict[str, float]:
    """``lr_last``, ``lr_mean``, ``lr_min``, ``lr_max`` of a run's step sizes."""
    if not step_sizes:
        return {}
    return {
        "lr_last": float(step_sizes[-1]),
        "lr_mean": float(math.fsum(step_sizes) / len(step_sizes)),
        "lr_min": float(min(step_sizes)),
        "lr_max": float(max(step_sizes)),
    }


def _directions(params: Sequence[torch.Tensor], weight_decay: float) -> list[torch.Tensor]:
    """Copies of the step directions ``grad + weight_decay * p`` (zeros without grad)."""
    out = []
    for p in params:
        d = torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
        if weight_decay:
            d.add_(p.detach(), alpha=weight_decay)
        out.append(d)
    return out


def _sq_norm64(tensors: Iterable[torch.Tensor]) -> float:
    """Squared L2 norm of the concatenated tensors, accumulated in float64."""
    return math.fsum(float(t.detach().to(torch.float64).square().sum()) for t in tensors)


def _diff_norm64(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """``||a - b||`` over the whole flattened vector, in float64."""
    return math.sqrt(
        math.fsum(
            float((x.to(torch.float64) - y.to(torch.float64)).square().sum())
            for x, y in zip(a, b, strict=True)
        )
    )


# ------------------------------------------------------------------------ the shells


class AdaptiveStepOptimizer(torch.optim.Optimizer):
    """An optimizer with one global step size, chosen every step.

    Takes a single parameter group. Scalar state lives with the first
    parameter (``torch.optim.LBFGS``'s layout), so ``state_dict()`` and
    ``load_state_dict()`` carry it. ``step_sizes`` logs the step size of
    every step taken by this instance.
    """

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError(
                f"Invalid parameter groups: {len(self.param_groups)} "
                f"({type(self).__name__} takes one: its step size is global)"
            )
        self._params: list[torch.Tensor] = self.param_groups[0]["params"]
        self.step_sizes: list[float] = []

    def _head(self) -> dict[str, Any]:
        return self.state[self._params[0]]  # type: ignore[no-any-return]

    @staticmethod
    def _require(closure: Callable[[], Any] | None) -> Callable[[], Any]:
        if closure is None:
            raise ValueError(
                "Invalid closure: None (pass a closure that zeroes the gradients, "
                "evaluates the minibatch loss, calls backward() and returns the loss)"
            )
        return closure


class DeltaSGD(AdaptiveStepOptimizer):
    r"""Delta-SGD: SGD with a locality-adaptive step size (Kim et al.).

    docs/algorithms.md#delta-sgd has the rule's keys and fedsim's choices.

    Paper: https://arxiv.org/abs/2306.00024, after Malitsky and Mishchenko (2020).
    Step ``k`` (``d = grad + weight_decay * x``, prox terms included by the
    closure):

    .. math::
        \eta_k = \min\Big(\frac{\gamma\|x_k - x_{k-1}\|}{2\|d(x_k; B_k) - d(x_{k-1}; B_k)\|},
                 \sqrt{1 + \delta\theta_{k-1}}\,\eta_{k-1}\Big) + \epsilon,\quad
        \theta_k = \eta_k/\eta_{k-1},\quad x_{k+1} = x_k - \eta_k d(x_k; B_k)

    * ``first_step="paper"``: step 0 uses ``eta0`` (Algorithm 1 line 8);
      ``"code"``: the rule with ``x_{-1} = x_0``, i.e. ``eta0 sqrt(1 + delta theta0)``
      (authors' code, docs/algorithms.md#delta-sgd-first-step).
    * ``batch_mode="same"`` (R-DS3): the closure is called first at
      ``x_{k-1}`` and then at ``x_k``, on the same minibatch; the last call is
      at ``x_k``, so the gradients left in ``.grad`` and a loss the closure
      records belong to ``x_k``. ``"previous"`` reuses ``d(x_{k-1}; B_{k-1})``.
    * The evaluation at ``x_{k-1}`` restores ``buffers`` (BatchNorm statistics)
      afterwards; ``mask_mode="shared"`` forks torch's RNG around it so both
      passes draw the same dropout masks, ``"independent"`` does not
      (authors' code, docs/algorithms.md#delta-sgd-dropout-masks). It is
      skipped when ``x`` did not move, where the rule takes the growth term
      whatever the gradients.
    * ``||x_k - x_{k-1}||`` is computed as ``eta_{k-1} ||d_{k-1}||``:
      exact for this update and free of float32 cancellation.
    """

    def __init__(
        self,
        params: Iterable[Any],
        eta0: float = 0.2,
        theta0: float = 1.0,
        gamma: float = 2.0,
        delta: float = 0.1,
        lr_eps: float = 1e-8,
        eta_max: float = math.inf,
        weight_decay: float = 0.0,
        first_step: str = "paper",
        batch_mode: str = "same",
        mask_mode: str = "independent",
        buffers: Iterable[torch.Tensor] = (),
    ) -> None:
        check_positive("eta0", eta0)
        check_positive("theta0", theta0, allow_inf=True)
        check_positive("gamma", gamma)
        check_nonnegative("delta", delta)
        check_nonnegative("lr_eps", lr_eps)
        check_positive("eta_max", eta_max, allow_inf=True)
        check_nonnegative("weight_decay", weight_decay)
        check_choice("first_step", first_step, FIRST_STEPS)
        check_choice("batch_mode", batch_mode, BATCH_MODES)
        check_choice("mask_mode", mask_mode, MASK_MODES)
        defaults = {
            "eta0": eta0, "theta0": theta0, "gamma": gamma, "delta": delta,
            "lr_eps": lr_eps, "eta_max": eta_max, "weight_decay": weight_decay,
            "first_step": first_step, "batch_mode": batch_mode, "mask_mode": mask_mode,
        }  # fmt: skip
        super().__init__(params, defaults)
        self._buffers = list(buffers)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Take one step; ``closure`` evaluates the current minibatch."""
        closure = self._require(closure)
        group = self.param_groups[0]
        head = self._head()
        k = head.get("step", 0)
        eta_prev = head.get("eta", group["eta0"])
        theta_prev = head.get("theta", group["theta0"])
        dx_norm = eta_prev * head["dir_norm"] if k > 0 else 0.0
        same = group["batch_mode"] == "same"
        prev_dirs = None
        if same and dx_norm > 0:
            prev_dirs = self._evaluate_previous(closure)
        with torch.enable_grad():
            loss = closure()
        dirs = _directions(self._params, group["weight_decay"])
        if not same and k > 0:
            prev_dirs = [self.state[p]["prev_dir"] for p in self._params]

        if k == 0 and group["first_step"] == "paper":
            eta, theta = min(group["eta0"], group["eta_max"]), theta_prev
        else:
            dg_norm = _diff_norm64(dirs, prev_dirs) if prev_dirs is not None else 0.0
            eta, theta = deltasgd_step_size(
                dx_norm, dg_norm, eta_prev, theta_prev, gamma=group["gamma"],
                delta=group["delta"], eps=group["lr_eps"], eta_max=group["eta_max"],
            )  # fmt: skip
        _check_step_fits(eta, self._params, k)

        for p, d in zip(self._params, dirs, strict=True):
            state = self.state[p]
            if same:  # a fresh tensor: a loaded state_dict may share the old one
                state["prev"] = p.detach().clone()
            else:
                state["prev_dir"] = d
            p.add_(d, alpha=-eta)
        head.update(step=k + 1, eta=eta, theta=theta, dir_norm=math.sqrt(_sq_norm64(dirs)))
        self.step_sizes.append(eta)
        return loss

    def _evaluate_previous(self, closure: Callable[[], Any]) -> list[torch.Tensor]:
        """Directions at ``x_{k-1}`` on the current minibatch; parameters and buffers restored."""
        group = self.param_groups[0]
        current = [p.detach().clone() for p in self._params]
        saved = [b.detach().clone() for b in self._buffers]
        for p in self._params:
            p.copy_(self.state[p]["prev"])
        devices = sorted(
            {
                torch.cuda.current_device() if p.device.index is None else p.device.index
                for p in self._params
                if p.device.type == "cuda"
            }
        )
        fork = torch.random.fork_rng(
            devices=devices, enabled=group["mask_mode"] == "shared", device_type="cuda"
        )
        with fork, torch.enable_grad():
            closure()
        dirs = _directions(self._params, group["weight_decay"])
        for p, c in zip(self._params, current, strict=True):
            p.copy_(c)
        for b, s in zip(self._buffers, saved, strict=True):
            b.copy_(s)
        return dirs


def _check_step_fits(eta: float, params: Sequence[torch.Tensor], k: int) -> None:
    """Raise :class:`StepOverflow` when ``eta`` is beyond the parameters' dtype.

    The step size is a float64; the step is taken in the parameters' dtype,
    where a step size past its largest finite value cannot be represented
    (``p.add_`` raises, or the parameters become infinite). The authors' code
    caps nothing (``eta_max`` is an opt-in cap), so such a run fails, and
    says why, instead of being silently clamped.
    """
    dtype = params[0].dtype if params else torch.float32
    limit = torch.finfo(dtype).max
    if not eta <= limit:
        raise StepOverflow(
            f"Delta-SGD's step size {eta:.3g} at local step {k} is beyond {dtype}'s range "
            f"({limit:.3g}): the gradients stopped changing and the step grew every step "
            "(client.eta_max caps it; no cap by default, as in the authors' code)")


class SPS(AdaptiveStepOptimizer):
    r"""Stochastic Polyak step size, SPS_max (Loizou et al. 2021; docs/algorithms.md#sps).

    Paper: https://arxiv.org/abs/2002.10542. With ``d = grad + weight_decay * x``
    and the objective value ``f`` returned by the closure (plus
    ``weight_decay/2 ||x||^2`` when set, so ``d`` is its gradient):

    .. math::
        \eta_k = \min\Big(\frac{f - f^*}{c\|d\|^2 + \epsilon}, \eta_{\max}\Big),
        \qquad x_{k+1} = x_k - \eta_k d

    ``mode="constant"`` is the rule above (the Delta-SGD authors' runs:
    ``c = 0.5``, ``f* = 0``, ``eps = 1e-8``, uncapped). ``mode="smooth"`` also
    caps ``eta_k`` by ``2^(1/n_batches) eta_{k-1}``, from ``eta_{-1} = eta0``
    (the official ``smooth_iter``). A zero gradient takes no step (logged as
    step size 0) and leaves the smooth-mode memory unchanged.
    """

    def __init__(
        self,
        params: Iterable[Any],
        c: float = 0.5,
        f_star: float = 0.0,
        eps: float = 1e-8,
        eta_max: float = math.inf,
        weight_decay: float = 0.0,
        mode: str = "constant",
        eta0: float = 1.0,
        n_batches: int = 500,
    ) -> None:
        check_positive("c", c)
        check_finite("f_star", f_star)
        check_nonnegative("eps", eps)
        check_positive("eta_max", eta_max, allow_inf=True)
        check_nonnegative("weight_decay", weight_decay)
        check_choice("mode", mode, SPS_MODES)
        check_positive("eta0", eta0)
        check_count("n_batches", n_batches)
        defaults = {
            "c": c, "f_star": f_star, "eps": eps, "eta_max": eta_max,
            "weight_decay": weight_decay, "mode": mode, "eta0": eta0, "n_batches": n_batches,
        }  # fmt: skip
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Take one step; ``closure`` evaluates the current minibatch and returns its loss."""
        closure = self._require(closure)
        group = self.param_groups[0]
        head = self._head()
        with torch.enable_grad():
            loss = closure()
        wd = group["weight_decay"]
        value = float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        if wd:
            value += 0.5 * wd * _sq_norm64(self._params)
        dirs = _directions(self._params, wd)
        grad_sq = _sq_norm64(dirs)
        smooth = group["mode"] == "smooth"
        eta = sps_step_size(
            value, grad_sq, c=group["c"], f_star=group["f_star"], eps=group["eps"],
            eta_max=group["eta_max"],
            eta_prev=head.get("eta", group["eta0"]) if smooth else None,
            growth=SPS_SMOOTH_BASE ** (1.0 / group["n_batches"]),
        )  # fmt: skip
        if eta:
            for p, d in zip(self._params, dirs, strict=True):
                p.add_(d, alpha=-eta)
            head["eta"] = eta
        head["step"] = head.get("step", 0) + 1
        self.step_sizes.append(eta)
        return loss
