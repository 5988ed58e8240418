"""The two forward quantizers AccEPT's Table 4 compares its multi-bit quantizer against (Sec. 4.3.2), as
training-time modules: the value a cut would send, dequantized, with the gradient a trainer needs.

* :class:`LsqQuantizer`: "uniform quantization with the scaling factor s initially set to 0.25 and
  updated by its gradients with respect to the training loss": learned step size quantization (LSQ,
  Esser et al. 2020), k-bit signed levels ``[-2^(k-1), 2^(k-1) - 1] * s``, the straight-through
  estimator for the activation and LSQ's gradient (scaled by ``1 / sqrt(N * Q_p)``) for ``s``.
* :class:`AmsgradMbq`: "AMSGrad [ALQ, Qu et al. 2020], which prunes the number of alpha by computing the
  increment of the training loss incurred by each alpha": multi-bit bases whose coefficients are
  parameters trained on the loss (by the caller's AMSGrad, ``torch.optim.Adam(amsgrad=True)``), starting
  with ``extra`` more bases than ``k`` and pruning, every ``prune_every`` training batches, the one whose
  removal raises the loss least by the first-order estimate ``|sum(g * B_i alpha_i)|`` accumulated since.

Neither goes on the wire (the runtime's codecs are :mod:`.multibit` and :mod:`.stochastic`); the bench
(``bench/compression.py --parts table4``) trains with them in one process, as the paper simulated its
three devices with three processes on one CPU.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from edgeagent.compression.multibit import assign_codes, residue_init, sign_table


class LsqQuantizer(nn.Module):
    """k-bit uniform quantization with a learned step (see the module doc)."""

    def __init__(self, k: int, init: float = 0.25) -> None:
        super().__init__()
        if not 2 <= k <= 8:
            raise ValueError(f"LSQ bit width must be in 2..8, got {k}")
        self.k = k
        self.step = nn.Parameter(torch.tensor(float(init)))
        self.qn, self.qp = 2 ** (k - 1), 2 ** (k - 1) - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = 1.0 / math.sqrt(x.numel() * self.qp)
        s = (self.step - self.step * g).detach() + self.step * g  # the value of step, its gradient times g
        v = torch.clamp(x / s, -self.qn, self.qp)
        v = (v.round() - v).detach() + v  # round with the straight-through estimator
        return v * s


class AmsgradMbq(nn.Module):
    """Multi-bit quantization with loss-trained coefficients and loss-aware pruning (see the module doc)."""

    mask: torch.Tensor  # (m,) 1 for a basis in use
    increment: torch.Tensor  # (m,) each basis's estimated loss increment since the last pruning

    def __init__(self, k: int, *, extra: int = 1, prune_every: int = 20) -> None:
        super().__init__()
        if not 1 <= k <= 4 or extra < 0 or k + extra > 6:
            raise ValueError(f"need 1 <= k <= 4 and k + extra <= 6, got k={k}, extra={extra}")
        self.k, self.prune_every = k, prune_every
        self.alpha = nn.Parameter(torch.zeros(k + extra))
        # A pruned basis is masked (its alpha held at 0), so the optimizer keeps the same parameter.
        self.register_buffer("mask", torch.ones(k + extra))
        self.register_buffer("increment", torch.zeros(k + extra))
        self.batches = 0
        self.started = False

    @property
    def bases(self) -> int:
        """Bases in use (bits sent per value)."""
        return int(self.mask.sum())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1)  # (N,)
        m = self.alpha.numel()
        if self.training and self.batches and self.batches % self.prune_every == 0 and self.bases > self.k:
            self._prune()  # here, before the mask is used: the last batch's backward has read it
        if not self.started:  # the first batch: residues, as the multi-bit quantizer starts
            self.alpha.data = residue_init(flat.detach(), m).to(torch.float32)
            self.started = True
        alpha = self.alpha * self.mask  # (m,)
        codes = assign_codes(flat.detach(), alpha.detach().to(torch.float64))  # (N,)
        signs = sign_table(m).to(torch.float32)[codes.to(torch.int64)]  # (N, m)
        quantized = signs @ alpha  # (N,) B alpha, differentiable in alpha
        out = (flat - flat.detach()) + quantized  # the straight-through estimator for x
        if self.training and out.requires_grad:
            parts = (signs * alpha.detach()).detach()  # (N, m) basis i's share B_i alpha_i
            out.register_hook(lambda g: self._account(g, parts))
            self.batches += 1
        return out.reshape(x.shape)

    def _account(self, grad: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
        # Removing basis i moves x_hat by -B_i alpha_i: to first order the loss changes by -g . B_i alpha_i.
        self.increment += (grad.unsqueeze(1) * parts).sum(0).abs()
        return grad

    def _prune(self) -> None:
        scores = torch.where(self.mask > 0, self.increment, torch.full_like(self.increment, math.inf))
        self.mask[int(scores.argmin())] = 0.0
        self.increment.zero_()


__all__ = ["AmsgradMbq", "LsqQuantizer"]
