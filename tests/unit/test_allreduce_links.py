"""The allreduce mode's pure parts: --fail-link, per-link timeouts, shards and the replica's arithmetic."""

from __future__ import annotations

import pytest
import torch

from edgeagent.allreduce.direct import DirectAllreduce
from edgeagent.allreduce.links import AdaptiveTimeouts, FailedLinks, FixedTimeouts, parse_failure
from edgeagent.allreduce.replica import Replica
from edgeagent.allreduce.shards import batch, shard, steps_per_epoch
from edgeagent.errors import ConfigError
from edgeagent.models import ModelSpec
from edgeagent.protocol.options import TrainOptions


def test_a_failed_link_drops_both_ways_during_its_steps_only() -> None:
    links = FailedLinks.parse(["worker-1,worker-3@20:22", "a,b@5"])
    assert links.blocked("worker-1", "worker-3", 20) and links.blocked("worker-3", "worker-1", 22)
    assert not links.blocked("worker-1", "worker-3", 19) and not links.blocked("worker-1", "worker-3", 23)
    assert not links.blocked("worker-1", "worker-2", 21)
    assert links.blocked("b", "a", 10**6) and not links.blocked("a", "b", 4)
    assert links.failed_at(21) == ["worker-1,worker-3@20:22", "a,b@5"]
    assert links.failed_at(3) == []


@pytest.mark.parametrize("text", ["a,b", "a@3", "a,a@3", "a,b@x", "a,b@5:3", "a,b@-1", ",b@1"])
def test_a_malformed_failed_link_is_a_config_error_naming_the_form(text: str) -> None:
    with pytest.raises(ConfigError, match="A,B@FROM"):
        parse_failure(text)


def test_adaptive_timeouts_follow_the_measured_round_trips_with_a_floor() -> None:
    t = AdaptiveTimeouts(floor=0.02, initial=1.0)
    t.ranks = ["w1", "w2", "w3"]
    assert t.timeout(1) == 1.0  # nothing measured yet
    for _ in range(50):
        t.observe(1, 0.010)
    assert t.timeout(1) == pytest.approx(0.02)  # 10 ms steady: srtt + 4 var < floor
    for _ in range(50):
        t.observe(2, 0.200)
    assert 0.2 <= t.timeout(2) < 0.25
    t.ranks = ["w3", "w2"]  # the members changed: the link to w3 keeps its history under its new rank
    assert 0.2 <= t.timeout(0) < 0.25
    assert FixedTimeouts(0.5).timeout(7) == 0.5


def test_shards_partition_the_samples_and_noniid_shards_see_few_labels() -> None:
    labels = torch.arange(1000) % 10
    iid = [shard(labels, i, 4, "iid", 0) for i in range(4)]
    assert sorted(torch.cat(iid).tolist()) == list(range(1000))
    noniid = [shard(labels, i, 5, "noniid", 0) for i in range(5)]
    assert sorted(torch.cat(noniid).tolist()) == list(range(1000))
    assert all(len(set(labels[s].tolist())) <= 3 for s in noniid)
    assert steps_per_epoch(1000, 4, 20) == 12
    rows = batch(iid[0], 13, 12, 20, 0)  # epoch 1, batch 1: a reshuffled order of the same shard
    assert len(rows) == 20 and set(rows.tolist()) <= set(iid[0].tolist())
    assert torch.equal(rows, batch(iid[0], 13, 12, 20, 0))


def test_direct_allreduce_and_the_replica_apply_the_exact_mean() -> None:
    grads = [torch.randn(6, generator=torch.Generator().manual_seed(r)) for r in range(3)]
    parts = [DirectAllreduce(r, 3, 0) for r in range(3)]
    sends = [s for r, p in enumerate(parts) for s in p.start(grads[r], 0.0)]
    for s in sends:
        parts[s.to].receive(s.msg, 0.0)
    results = [p.result() for p in parts]
    first = results[0]
    assert first is not None and all(r is not None and torch.equal(r, first) for r in results)
    assert torch.allclose(first, (grads[0] + grads[1] + grads[2]) / 3)
    assert [p.contributors() for p in parts] == [(0, 1, 2)] * 3
    spec = ModelSpec("mlp", (1, 28, 28), 10, (("hidden", (512,)),))
    replica = Replica(spec, 0, TrainOptions(learning_rate=0.1))
    assert replica.size == 407_050
    before = replica.flat()
    replica.apply(torch.ones(replica.size), 10)
    assert torch.allclose(replica.flat(), before - 0.01)
    with pytest.raises(ValueError, match="407050 parameters"):
        replica.load_flat(torch.zeros(3))
