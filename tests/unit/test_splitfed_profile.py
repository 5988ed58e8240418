"""Tests for edgeagent.splitfed.profile: what PiPar's profiling phase measures of a model."""

from __future__ import annotations

import math

import pytest

from edgeagent.models import ModelSpec, layer_output_shapes
from edgeagent.splitfed.cost import Choice, DeviceCosts, iteration_time
from edgeagent.splitfed.profile import param_bytes, profile_layers

SPEC = ModelSpec("vgg5", (1, 28, 28), 10)


def test_profile_gives_every_layer_its_times_and_sizes() -> None:
    times, act, grad = profile_layers(SPEC, 8, iterations=1)
    assert times.layers == 5 and len(act) == 5 and len(grad) == 5
    assert all(t > 0 for t in times.fwd) and all(t > 0 for t in times.bwd)
    shapes = layer_output_shapes(SPEC, batch_size=8)
    assert list(act) == [4.0 * math.prod(s) for s in shapes]  # float32 outputs at batch B
    assert grad == act  # a gradient has its activation's shape
    assert times.fwd_fixed == () and times.bwd_fixed == ()
    # What the plan needs: one device's iteration can be estimated from it.
    device = DeviceCosts("pi", times, 1e6, 1e6, 100)
    assert iteration_time(device, times, act, grad, Choice(2, 4), batch_size=8) > 0


def test_fit_fixed_splits_each_time_within_its_bounds() -> None:
    times, _, _ = profile_layers(SPEC, 16, iterations=1, fit_fixed=True)
    assert len(times.fwd_fixed) == 5 and len(times.bwd_fixed) == 5
    assert all(0 <= f <= t for f, t in zip(times.fwd_fixed, times.fwd, strict=True))
    assert all(0 <= f <= t for f, t in zip(times.bwd_fixed, times.bwd, strict=True))


def test_param_bytes_per_layer() -> None:
    sizes = param_bytes(SPEC)
    # conv 1->32 (3x3) with bias, then BatchNorm's weight, bias, running mean/var and its batch counter.
    assert sizes[0] == 4 * (32 * 9 + 32) + 4 * 4 * 32 + 8
    assert sizes[4] == 4 * (128 * 10 + 10)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        profile_layers(SPEC, 1)
    with pytest.raises(ValueError, match="iterations"):
        profile_layers(SPEC, 4, iterations=0)
