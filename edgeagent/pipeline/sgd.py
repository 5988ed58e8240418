"""SGD with momentum and weight decay: torch.optim.SGD's arithmetic, without its start-up cost.

Every method of ``torch.optim.Optimizer`` is wrapped in ``torch._disable_dynamo``, which imports
``torch._dynamo`` on its first call: 1.1 s on an idle x86 core, over 2 s while two devices start on one
machine, and 10-50 times that on a Pi. Every device paid it when it built its first stage, in the
critical path of every start and every join. No role compiles anything, so this class applies the same
update with plain tensor operations, in the same order (``torch.optim.SGD``'s single-tensor path, the
one it takes on the CPU, with ``dampening=0``, ``maximize=False``)::

    d = grad + weight_decay * p
    b = d (first step), else momentum * b + d
    p = p - lr * b (or p - lr * d without momentum; p - lr * (d + momentum * b) with ``nesterov``)

so a run's weights are bit-for-bit those ``torch.optim.SGD`` would give (tests/unit/test_sgd.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol

import torch


class SgdOptions(Protocol):
    """What an update needs of a run's options (``TrainOptions``, ``TrainConfig``)."""

    @property
    def learning_rate(self) -> float: ...

    @property
    def momentum(self) -> float: ...

    @property
    def weight_decay(self) -> float: ...


def rate_factor(
    schedule: str, step: int, total: int, steps: tuple[int, ...] = (), gamma: float = 0.1
) -> float:
    """The learning rate of update ``step`` (0-based) of ``total``, as a share of the set one: ``constant``
    1; ``cosine`` ``(1 + cos(pi * step / total)) / 2`` (SGDR without restarts: from the set rate to 0);
    ``step`` ``gamma ** (milestone updates in steps reached)`` (torch's MultiStepLR, per update)."""
    if schedule == "step":
        return float(gamma ** sum(1 for s in steps if s <= step))
    if schedule == "constant" or total <= 0:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(max(step, 0), total) / total))


class SGD:
    """``torch.optim.SGD(params, lr, momentum, weight_decay, nesterov)``'s update, state and zero_grad
    (``nesterov`` when ``options`` has a true ``nesterov``: a stage's ``staleness.StepRule``)."""

    def __init__(self, params: Iterable[torch.Tensor], options: SgdOptions) -> None:
        for name in ("learning_rate", "momentum", "weight_decay"):
            value = getattr(options, name)
            if not value >= 0:  # NaN too
                raise ValueError(f"SGD {name} must be >= 0, got {value}")
        self.params = list(params)
        self.lr = float(options.learning_rate)
        self.momentum = float(options.momentum)
        self.weight_decay = float(options.weight_decay)
        self.nesterov = bool(getattr(options, "nesterov", False))
        # Per parameter, as torch.optim keeps it: {"momentum_buffer": tensor} once a step has run.
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient.

        Once every parameter has a gradient and a momentum buffer (every step of a run after its first),
        the update is one multi-tensor call per operation (torch.optim's ``foreach`` path); on the CPU
        those apply the very per-tensor kernels of the loop below, so the weights are the same bit for bit.
        """
        params = self.params
        grads = [p.grad for p in params]
        state = self.state
        if params and self.momentum != 0 and all(g is not None for g in grads):
            bufs = [state[p].get("momentum_buffer") if p in state else None for p in params]
            if all(b is not None for b in bufs):
                self._step_foreach(params, grads, bufs)  # type: ignore[arg-type]
                return
        for p in params:
            grad = p.grad
            if grad is None:
                continue
            if self.weight_decay != 0:
                grad = grad.add(p, alpha=self.weight_decay)
            if self.momentum != 0:
                buf = self.state[p].get("momentum_buffer")
                if buf is None:
                    buf = self.state[p]["momentum_buffer"] = grad.detach().clone()
                else:
                    buf.mul_(self.momentum).add_(grad)
                grad = grad.add(buf, alpha=self.momentum) if self.nesterov else buf
            p.add_(grad, alpha=-self.lr)

    def _step_foreach(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor]
    ) -> None:
        """:meth:`step` with momentum, every parameter with a gradient and a buffer: the loop's arithmetic
        (``d = g + wd * p``; ``b = mu * b + d``; ``p -= lr * b``, or ``lr * (d + mu * b)`` with Nesterov)."""
        if self.weight_decay != 0:
            grads = list(torch._foreach_add(grads, params, alpha=self.weight_decay))
        torch._foreach_mul_(bufs, self.momentum)
        torch._foreach_add_(bufs, grads)
        steps = torch._foreach_add(grads, bufs, alpha=self.momentum) if self.nesterov else bufs
        torch._foreach_add_(params, steps, alpha=-self.lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().requires_grad_(False)
                p.grad.zero_()

    def state_dict(self) -> dict[int, torch.Tensor]:
        """Momentum buffers (copies) by parameter index: what :meth:`load_state_dict` takes back."""
        return {
            i: self.state[p]["momentum_buffer"].clone()
            for i, p in enumerate(self.params)
            if "momentum_buffer" in self.state.get(p, {})
        }

    def load_state_dict(self, state: dict[int, torch.Tensor]) -> None:
        self.state.clear()
        for i, buf in state.items():
            self.state[self.params[i]]["momentum_buffer"] = buf.clone()
