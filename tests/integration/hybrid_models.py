"""Models for the hybrid-stage tests (imported by the worker processes by their dotted path)."""

from __future__ import annotations

from torch import nn


def heavy_conv(in_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """A cheap first layer (the central node's), one convolution that holds nearly all the compute and
    few parameters (so a second device on its stage pays off: little to exchange, much to share), and a
    cheap head. Splitting it further cannot help: only replicating the convolution's stage can."""
    channels = in_shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, channels, kernel_size=1),
        nn.Sequential(nn.Conv2d(channels, 48, kernel_size=3, padding=1), nn.ReLU()),
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(48, num_classes)),
    )
