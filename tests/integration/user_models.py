"""A user model for the allow-list tests (imported by the worker processes by its dotted path)."""

from __future__ import annotations

import math

from torch import nn


def small_mlp(in_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """Three layers: one for the central node, the rest for one or two workers."""
    return nn.Sequential(
        nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), 32), nn.ReLU()),
        nn.Sequential(nn.Linear(32, 32), nn.ReLU()),
        nn.Linear(32, num_classes),
    )
