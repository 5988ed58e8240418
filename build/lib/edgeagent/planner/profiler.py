"""Profiling of a model's layers on the central node (papers/000 Sec. III-B)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class LayerProfile:
    """Per layer: forward+backward seconds for one batch, and output bytes (``D_j``)."""

    seconds: tuple[float, ...]
    output_bytes: tuple[int, ...]
    # One sample of each layer's output (the batch dimension left out); what the next stage must receive.
    output_shapes: tuple[tuple[int, ...], ...] = ()
    output_dtypes: tuple[str, ...] = ()  # e.g. "float32"

    def to_dict(self) -> dict[str, list[float] | list[int]]:
        return {"seconds": list(self.seconds), "output_bytes": list(self.output_bytes)}


def profile_layers(layers: Sequence[nn.Module], sample: torch.Tensor, *, runs: int = 10) -> LayerProfile:
    """Time forward+backward of every layer on ``sample`` (a batch), averaged over ``runs`` runs.

    Each layer is timed on its real input (the previous layer's output) with a gradient of ones, so
    the times add up to a whole training step. One warm-up run is not counted.
    """
    totals = [0.0] * len(layers)
    sizes = [0] * len(layers)
    shapes: list[tuple[int, ...]] = [()] * len(layers)
    dtypes = [""] * len(layers)
    for run in range(runs + 1):
        x = sample
        for j, layer in enumerate(layers):
            inp = x.detach().requires_grad_(x.is_floating_point() and j > 0)
            started = time.perf_counter()
            out = layer(inp)
            out.backward(torch.ones_like(out))
            elapsed = time.perf_counter() - started
            if run > 0:
                totals[j] += elapsed
            sizes[j] = out.numel() * out.element_size()
            shapes[j] = tuple(out.shape[1:])
            dtypes[j] = str(out.dtype).removeprefix("torch.")
            x = out.detach()
        for layer in layers:
            layer.zero_grad(set_to_none=True)
    return LayerProfile(
        seconds=tuple(t / runs for t in totals),
        output_bytes=tuple(sizes),
        output_shapes=tuple(shapes),
        output_dtypes=tuple(dtypes),
    )
