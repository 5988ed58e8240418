"""Backward from a received gradient without torch's first-call import of sympy.

``tensor.backward(grad)`` checks ``grad``'s shape with ``torch.fx.experimental.symbolic_shapes``, which it
imports (with sympy) on the first call: 0.3-0.5 s on an x86 core, 10-50 times that on a Pi, paid by
every stage but the last at its first batch. ``sum(output * grad)`` has ``grad`` as its gradient with
respect to ``output`` exactly (1.0 * g for every element), so every gradient upstream is the same, bit
for bit, for one elementwise product more (tests/unit/test_sgd.py).
"""

from __future__ import annotations

import torch


def backward_with(output: torch.Tensor, grad: torch.Tensor) -> None:
    """``output.backward(grad)``: accumulate the gradients of everything ``output`` was computed from."""
    if grad.shape != output.shape:
        raise ValueError(f"gradient of shape {tuple(grad.shape)} for an output of {tuple(output.shape)}")
    torch.sum(output * grad).backward()
