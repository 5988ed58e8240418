"""edgeagent's SGD gives torch.optim.SGD's weights bit for bit, and never imports torch._dynamo."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from edgeagent.pipeline.sgd import SGD


@dataclass(frozen=True)
class Options:
    learning_rate: float
    momentum: float = 0.0
    weight_decay: float = 0.0


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _train_alike(pairs: list[tuple[nn.Module, Any]], *, steps: int, rows: int, seed: int) -> None:
    """The same batches through every (model, optimizer) pair, one step each per batch."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(rows, 8, generator=gen), torch.randint(0, 4, (rows,), generator=gen)
        for model, opt in pairs:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize(
    "options",
    [Options(0.1), Options(0.05, momentum=0.9), Options(0.05, momentum=0.9, weight_decay=5e-4)],
    ids=["plain", "momentum", "momentum+decay"],
)
def test_weights_and_momentum_equal_torch_sgd_bit_for_bit(options: Options) -> None:
    ours_model, torch_model = _model(1), _model(1)
    ours = SGD(ours_model.parameters(), options)
    reference = torch.optim.SGD(
        torch_model.parameters(),
        lr=options.learning_rate,
        momentum=options.momentum,
        weight_decay=options.weight_decay,
    )
    _train_alike([(ours_model, ours), (torch_model, reference)], steps=6, rows=5, seed=2)
    for a, b in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        assert torch.equal(a, b)
        assert a.grad is None
        if options.momentum:
            assert torch.equal(ours.state[a]["momentum_buffer"], reference.state[b]["momentum_buffer"])
        else:
            assert not ours.state.get(a)


def test_a_parameter_without_gradient_is_left_alone_and_state_round_trips() -> None:
    model = _model(3)
    first, second = list(model.parameters())[:2]
    opt = SGD(model.parameters(), Options(0.1, momentum=0.5))
    before = second.detach().clone()
    first.grad = torch.ones_like(first)
    opt.step()
    assert torch.equal(second, before)
    saved = opt.state_dict()
    assert list(saved) == [0]
    opt.step()
    assert not torch.equal(opt.state[first]["momentum_buffer"], saved[0])
    opt.load_state_dict(saved)
    assert torch.equal(opt.state[first]["momentum_buffer"], saved[0])
    opt.zero_grad(set_to_none=False)
    assert first.grad is not None and not first.grad.any()


@pytest.mark.parametrize("bad", [{"learning_rate": -0.1}, {"momentum": float("nan")}])
def test_a_negative_or_nan_setting_is_refused(bad: dict[str, float]) -> None:
    settings = {"learning_rate": 0.1, **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        SGD(_model(0).parameters(), Options(**settings))


def test_backward_with_a_received_gradient_equals_tensor_backward_bit_for_bit() -> None:
    from edgeagent.pipeline.backward import backward_with

    ours, reference = _model(4), _model(4)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(5))
    grad = torch.randn(6, 4, generator=torch.Generator().manual_seed(6))
    backward_with(ours(x), grad)
    reference(x).backward(grad)
    for a, b in zip(ours.parameters(), reference.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad)
    with pytest.raises(ValueError, match=r"\(6, 3\)"):
        backward_with(ours(x), torch.zeros(6, 3))


@dataclass(frozen=True)
class NesterovOptions:
    learning_rate: float
    momentum: float
    weight_decay: float
    nesterov: bool = True


@pytest.mark.parametrize("nesterov", [False, True])
def test_the_multi_tensor_steps_equal_torch_sgd_bit_for_bit(nesterov: bool) -> None:
    """Every step after the first takes the multi-tensor path: 20, with decay, heavy ball, Nesterov."""
    options = NesterovOptions(0.05, momentum=0.7, weight_decay=4e-5, nesterov=nesterov)
    ours_model, torch_model = _model(4), _model(4)
    ours = SGD(ours_model.parameters(), options)
    reference = torch.optim.SGD(
        torch_model.parameters(), lr=0.05, momentum=0.7, weight_decay=4e-5, nesterov=nesterov, foreach=False
    )
    _train_alike([(ours_model, ours), (torch_model, reference)], steps=20, rows=7, seed=5)
    for a, b in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        assert torch.equal(a, b)
        assert torch.equal(ours.state[a]["momentum_buffer"], reference.state[b]["momentum_buffer"])
