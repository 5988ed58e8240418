"""Backward from a received gradient without torch's first-call import of sympy, and without its wrapper.

``tensor.backward(grad)`` checks ``grad``'s shape with ``torch.fx.experimental.symbolic_shapes``, which it
imports (with sympy) on the first call: 0.3-0.5 s on an x86 core, 10-50 times that on a Pi, paid by
every stage but the last at its first batch. :func:`backward_with` checks the shape itself and hands
``grad`` to the autograd engine as ``torch.autograd.backward`` does after its checks
(``torch.autograd.graph._engine_run_backward``, the engine's one entry point since torch 2.3): the same
gradients bit for bit (tests/unit/test_sgd.py), without the wrapper's Python (``_make_grads``, the
argument tuples: about 10 us per backward, every batch on every stage but the last). A torch without
that entry point takes the old way: ``sum(output * grad)``, whose gradient with respect to ``output`` is
``grad`` exactly (1.0 * g for every element), for one elementwise product more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_run_backward: Callable[..., Any] | None = getattr(torch.autograd.graph, "_engine_run_backward", None)


def backward_with(output: torch.Tensor, grad: torch.Tensor) -> None:
    """``output.backward(grad)``: accumulate the gradients of everything ``output`` was computed from."""
    if grad.shape != output.shape:
        raise ValueError(f"gradient of shape {tuple(grad.shape)} for an output of {tuple(output.shape)}")
    if _run_backward is None or grad.dtype != output.dtype:
        torch.sum(output * grad).backward()
        return
    # torch.autograd.backward's own call: no graph kept, none built, every leaf accumulates.
    _run_backward((output,), (grad,), False, False, (), allow_unreachable=True, accumulate_grad=True)
