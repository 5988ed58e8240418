"""Tests for edgeagent.splitfed.similar: devices alike but for noise are planned as one."""

from __future__ import annotations

import pytest

from edgeagent.splitfed.cost import Choice, DeviceCosts, LayerTimes
from edgeagent.splitfed.plan import select
from edgeagent.splitfed.similar import pooled, similar_groups

FWD = (0.02, 0.15, 0.10, 0.01, 0.002)  # a VGG-5-like device at the full batch
ACT = (2.5e5, 1.25e5, 2.3e4, 5.1e3, 4e2)


def _device(name: str, scale: float = 1.0, up: float = 1e6, latency: float = 0.02) -> DeviceCosts:
    times = LayerTimes(tuple(x * scale for x in FWD), tuple(2 * x * scale for x in FWD))
    return DeviceCosts(name, times, up, 2.5 * up, 600, latency_s=latency)


def test_alike_devices_group_and_a_device_twice_as_slow_stays_alone() -> None:
    devices = [
        _device("a"),
        _device("b", scale=1.2, up=1.15e6),  # noise: 20 % compute, 15 % uplink
        _device("slow", scale=2.0),
        _device("c", scale=0.95, latency=0.021),
    ]
    assert similar_groups(devices, 0.3) == [("a", "b", "c"), ("slow",)]
    assert similar_groups(devices, 0.0) == [("a",), ("b",), ("slow",), ("c",)]


def test_a_group_needs_every_member_alike_not_a_chain() -> None:
    # a ~ b and b ~ c, but a and c are 1.56x apart: c does not join by way of b.
    devices = [_device("a"), _device("b", scale=1.25), _device("c", scale=1.5625)]
    assert similar_groups(devices, 0.3) == [("a", "b"), ("c",)]


def test_links_and_latency_and_memory_split_groups() -> None:
    base = _device("a")
    assert similar_groups([base, _device("slow-link", up=0.5e6)], 0.3) == [("a",), ("slow-link",)]
    assert similar_groups([base, _device("far", latency=0.08)], 0.3) == [("a",), ("far",)]
    small = DeviceCosts("small", base.times, base.up_bps, base.down_bps, 600, max_layers=2)
    assert similar_groups([base, small], 0.3) == [("a",), ("small",)]
    with pytest.raises(ValueError, match=r"tolerance must be >= 0, got -0\.1"):
        similar_groups([base], -0.1)


def test_pooled_gives_each_member_the_mean_and_keeps_its_own_data_size() -> None:
    a, b = _device("a", up=1e6), _device("b", scale=1.2, up=1.2e6)
    b = DeviceCosts(b.name, b.times, b.up_bps, b.down_bps, 900, latency_s=0.03)
    pa, pb = pooled([a, b], [("a", "b")])
    assert pa.times == pb.times
    assert pa.times.fwd == pytest.approx(tuple(x * 1.1 for x in FWD))
    assert pa.up_bps == pytest.approx(1.1e6) and pb.latency_s == pytest.approx(0.025)
    assert (pa.name, pa.samples, pb.name, pb.samples) == ("a", 600, "b", 900)
    alone = pooled([a, b], [("a",), ("b",)])
    assert alone == [a, b]


def test_a_group_takes_one_choice_where_noise_alone_split_it() -> None:
    server = LayerTimes(tuple(x / 30 for x in FWD), tuple(2 * x / 30 for x in FWD))
    devices = [_device("a", scale=1.0, up=1.5e5), _device("b", scale=1.25, up=1.25e5)]
    apart = select(devices, server, ACT, ACT, 100)
    assert apart["a"] != apart["b"]  # the noise alone gives them different (P, N)
    groups = similar_groups(devices, 0.3)
    together = select(pooled(devices, groups), server, ACT, ACT, 100, groups=groups)
    assert together["a"] == together["b"]
    assert isinstance(together["a"], Choice)


def test_groups_must_cover_every_device_once() -> None:
    server = LayerTimes(FWD, FWD)
    devices = [_device("a"), _device("b")]
    with pytest.raises(ValueError, match="must hold every device exactly once"):
        select(devices, server, ACT, ACT, 20, groups=[("a",)])
