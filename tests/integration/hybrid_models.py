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


def heavy_first(in_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """Nearly all the compute in the first layer (stage 0's, the central node's), with few parameters and
    a small output: helpers on stage 0 pay off when the central node is slow (their input rows and the
    gradient sums are small), while no split can move that layer off the central node."""
    channels = in_shape[0]
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(channels, 32, kernel_size=3, padding=1), nn.ReLU(), nn.AvgPool2d(8)),
        nn.Sequential(nn.Flatten(), nn.Linear(32 * (in_shape[1] // 8) * (in_shape[2] // 8), 64), nn.ReLU()),
        nn.Linear(64, num_classes),
    )
