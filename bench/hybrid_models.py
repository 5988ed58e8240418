"""Models for ``bench/hybrid.py``'s scenarios 4 and 5, imported by the worker processes by its dotted path."""

from __future__ import annotations

from torch import nn


def one_heavy_layer(in_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """Asteroid's case for replicated stages: nearly all the compute in one layer that no cut can split
    (a 3x3 convolution at full resolution, pooled before it leaves the layer), with few parameters (a
    replica's gradient exchange is small), between a cheap first layer and a cheap head."""
    channels = in_shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, channels, kernel_size=1),
        nn.Sequential(
            nn.Conv2d(channels, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
        ),
        nn.Linear(64 * 16, num_classes),
    )


def heavy_first_layer(in_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """Scenario 5: nearly all the compute in the first layer (a 3x3 convolution at full resolution,
    pooled before it leaves the layer), which stage 0, the central node's, always holds: when the
    central node is the slowest device only helpers on stage 0 (fed with its input rows) can share it.
    Few parameters (a small gradient exchange) and a small output."""
    channels = in_shape[0]
    return nn.Sequential(
        nn.Sequential(
            nn.Conv2d(channels, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
        ),
        nn.Sequential(nn.Linear(64 * 16, 64), nn.ReLU()),
        nn.Linear(64, num_classes),
    )
