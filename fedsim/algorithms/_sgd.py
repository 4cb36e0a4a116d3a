"""SGD and SGD with momentum as fedsim's clients step them: torch's update, without torch.optim.

:class:`SGD` computes exactly what ``torch.optim.SGD`` computes on the CPU
(its single-tensor path, which is the one torch takes for CPU tensors), bit
for bit, step after step (``tests/algorithms/test_sgd.py`` holds it to that
against ``torch.optim.SGD`` itself). It exists for two measured costs of
``torch.optim`` that a simulator of many short local runs pays over and over:

* every ``torch.optim.Optimizer`` constructor (``add_param_group``) and
  ``zero_grad`` is wrapped to disable ``torch.compile`` tracing, and the
  first call imports ``torch._dynamo``: 0.8 s of start-up in every process
  that trains, on this kind of machine;
* ``step`` goes through that wrapper, a profiler record, hook dispatch and
  per-step regrouping of the parameters: about 60 us per step here, against
  150 us for a whole forward, backward and update of the 60-200-10 MLP on a
  batch of 32.

What it does not do: ``maximize``, ``nesterov``, ``dampening``, sparse
gradients, per-group hyperparameters, ``state_dict``. fedsim's client
configurations never ask for them (``sgd`` and ``sgdm`` in
:mod:`fedsim.algorithms.optim`); ``adam`` and ``adagrad`` stay
``torch.optim`` optimizers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from fedsim.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")

__all__ = ["SGD"]


class SGD:
    """``torch.optim.SGD(params, lr, momentum, weight_decay)``'s update, stepped directly.

    ``param_groups[0]["lr"]`` is read at every step, as torch's is, so code
    that changes the step size between steps works the same.
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        self.params: list[torch.Tensor] = list(params)
        self.param_groups: list[dict[str, Any]] = [
            {"params": self.params, "lr": float(lr), "momentum": float(momentum),
             "weight_decay": float(weight_decay)}]
        self._buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients, as ``torch.optim.Optimizer.zero_grad`` does."""
        for p in self.params:
            g = p.grad
            if g is None:
                continue
            if set_to_none:
                p.grad = None
                continue
            if g.grad_fn is not None:
                g.detach_()
            else:
                g.requires_grad_(False)
            g.zero_()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update (after evaluating ``closure`` with gradients on, if given)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        group = self.param_groups[0]
        lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
        buffers = self._buffers
        with torch.no_grad():
            for i, p in enumerate(self.params):
                grad = p.grad
                if grad is None:
                    continue
                if decay != 0:
                    grad = grad.add(p, alpha=decay)
                if momentum != 0:
                    buf = buffers[i]
                    if buf is None:
                        buf = buffers[i] = grad.detach().clone()
                    else:
                        buf.mul_(momentum).add_(grad, alpha=1.0)
                    grad = buf
                p.add_(grad, alpha=-lr)
        return loss
