"""AccEPT Table 4's two baseline quantizers (compression.baselines): learned-step uniform quantization and
AMSGrad-trained multi-bit quantization with loss-aware pruning. Pure: no broker."""

from __future__ import annotations

import pytest
import torch

from edgeagent.compression.baselines import AmsgradMbq, LsqQuantizer


def test_lsq_sends_k_bit_levels_of_its_step_and_learns_the_step() -> None:
    q = LsqQuantizer(2)  # levels -2..1 times 0.25
    x = torch.tensor([-1.0, -0.3, 0.0, 0.1, 0.2, 0.9], requires_grad=True)
    y = q(x)
    assert y.tolist() == pytest.approx([-0.5, -0.25, 0.0, 0.0, 0.25, 0.25])
    y.sum().backward()
    assert x.grad is not None and q.step.grad is not None
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]  # straight through inside the range only
    assert float(q.step.grad) != 0.0
    with pytest.raises(ValueError):
        LsqQuantizer(1)


def test_amsgrad_mbq_prunes_to_k_bases_and_sends_at_most_2_to_the_k_values() -> None:
    torch.manual_seed(0)
    q = AmsgradMbq(2, extra=1, prune_every=3)
    opt = torch.optim.Adam([q.alpha], lr=1e-2, amsgrad=True)
    assert q.bases == 3
    for _ in range(4):
        x = torch.randn(256, requires_grad=True)
        loss = (q(x) - 0.5).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert q.bases == 2  # pruned once, after 3 batches
    assert int(q.mask.sum()) == 2 and q.alpha.grad is not None
    with torch.no_grad():
        values = q.eval()(torch.randn(1000))
    assert len(set(values.tolist())) <= 4
    with pytest.raises(ValueError):
        AmsgradMbq(5)
