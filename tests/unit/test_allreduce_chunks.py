"""The ft-tree's exchange by chunks (issue 54): the cut, the fixed order of the sum, and the chunked
collective on the in-memory driver: the same mean as the paper's one-message exchange, bit for bit, with
and without link failures and whatever order messages arrive in."""

from __future__ import annotations

import pytest
import torch

from edgeagent.allreduce import topology
from edgeagent.allreduce.base import CollectiveMsg
from edgeagent.allreduce.chunks import MAX_CHUNKS, ChunkSum, bounds, count
from edgeagent.allreduce.ft_tree import FtTreeAllreduce, Variant
from edgeagent.allreduce.sim import FAULTS, FixedTimeouts, SimResult, run_step
from edgeagent.errors import ConfigError

T = 0.5


def grads_for(n: int, seed: int, dim: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # magnitudes spread over 8 decades: float sums then depend on their order
    return [
        torch.randn(dim, generator=g) * 10.0 ** torch.randint(-4, 4, (dim,), generator=g) for _ in range(n)
    ]


def run(
    n: int,
    grads: list[torch.Tensor],
    chunk_floats: int | None,
    *,
    variant: Variant = "proactive",
    **kwargs: object,
) -> SimResult:
    t = FixedTimeouts(T)
    coll = [FtTreeAllreduce(r, n, 0, t, variant=variant, chunk_floats=chunk_floats) for r in range(n)]
    return run_step(coll, grads, **kwargs)  # type: ignore[arg-type]


def test_count_and_bounds() -> None:
    assert count(407_050, None) == 1
    assert count(407_050, 1 << 17) == 4
    assert count(10, 10) == 1 and count(11, 10) == 2 and count(0, 4) == 1
    assert count(10**9, 1) == MAX_CHUNKS
    assert bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert bounds(0, 1) == [(0, 0)]
    for numel, k in [(407_050, 4), (13, 5), (5, 5), (1000, 7)]:
        b = bounds(numel, k)
        assert b[0][0] == 0 and b[-1][1] == numel and all(b[i][1] == b[i + 1][0] for i in range(k - 1))
        sizes = [hi - lo for lo, hi in b]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    with pytest.raises(ValueError):
        count(5, 0)
    with pytest.raises(ValueError):
        bounds(5, MAX_CHUNKS + 1)


def test_chunk_sum_adds_in_the_childrens_order_whatever_the_arrival() -> None:
    own, left, right = torch.tensor([1e8]), torch.tensor([1.0]), torch.tensor([-1e8])
    expected = (own + left) + right  # 1.0 lost to rounding on the way: order matters
    assert not torch.equal(expected, (own + right) + left)
    for arrival in ([(3, left), (4, right)], [(4, right), (3, left)]):
        part = ChunkSum(own.clone(), 1, (3, 4))
        for origin, data in arrival:
            assert not part.complete
            assert part.offer(origin, frozenset({origin}), data) == "new"
        assert part.complete and part.contrib == {1, 3, 4}
        assert torch.equal(part.data, expected)


def test_chunk_sum_dedup_and_rejects() -> None:
    part = ChunkSum(torch.zeros(2), 1, (3, 4))
    one = torch.ones(2)
    assert part.offer(4, frozenset({4, 9}), one) == "new"  # held until 3 is in
    assert part.offer(4, frozenset({4}), one) == "dup"  # the same sum by another path
    assert part.offer(3, frozenset({3, 9}), one) == "bad"  # overlaps what is held
    assert part.offer(5, frozenset({5}), one) == "bad"  # not a child
    assert part.offer(3, frozenset(), one) == "bad"
    assert part.offer(3, frozenset({3}), one) == "new" and part.complete
    assert part.offer(3, frozenset({3}), one) == "dup"
    assert part.offer(3, frozenset({8}), one) == "bad"  # a second, different sum from a child in
    assert torch.equal(part.data, 2 * one)


@pytest.mark.parametrize("chunk_floats", [1, 3, 4, 13])
@pytest.mark.parametrize("case", ["none", "1", "2-parallel", "2-serial"])
def test_chunked_mean_equals_the_papers_exchange_bit_for_bit(chunk_floats: int, case: str) -> None:
    for n in (7, 10, 15):
        grads = grads_for(n, 500 + n, dim=13)
        whole = run(n, grads, None, failed_links=FAULTS[case])
        cut = run(n, grads, chunk_floats, failed_links=FAULTS[case])
        assert whole.completion_time is not None and cut.completion_time is not None
        assert torch.allclose(whole.results[0], torch.stack(grads).mean(0), rtol=1e-5, atol=1e-6)  # type: ignore[arg-type]
        for r in range(n):
            assert torch.equal(cut.results[r], whole.results[0]), f"rank {r}"  # type: ignore[arg-type]
        assert cut.all_done and all(c == tuple(range(n)) for c in cut.contributors)
        chunks = count(13, chunk_floats)
        # data messages per chunk, metadata per step: the same metadata as the paper's exchange
        assert cut.sent["data_reduce"] == chunks * whole.sent["data_reduce"]
        for kind in ("meta_reduce_sent", "meta_reduce_received", "meta_bcast_received", "meta_bcast_sent"):
            assert cut.sent.get(kind) == whole.sent.get(kind), kind
        if case != "none":
            assert cut.sent["data_reduce_request"] >= chunks * len(FAULTS[case])


@pytest.mark.parametrize("variant", ["proactive", "thesis"])
def test_chunked_mean_when_messages_overtake_each_other(variant: Variant) -> None:
    # chunks of one sum arrive out of order, relays race the main link: still the one-message mean
    for seed in range(12):
        n = 7 + seed % 9
        grads = grads_for(n, 700 + seed, dim=11)
        whole = run(n, grads, None, variant=variant)
        for links in FAULTS.values():
            res = run(
                n, grads, 4, variant=variant, failed_links=links, jitter=20.0, seed=seed, start_times=None
            )
            assert res.all_done
            for r in range(n):
                assert torch.equal(res.results[r], whole.results[0]), (seed, links, r)  # type: ignore[arg-type]


def test_chunked_survives_any_single_main_link_failure_and_late_starts() -> None:
    n = 11
    grads = grads_for(n, 3, dim=9)
    whole = run(n, grads, None)
    starts = [4 * T if r < 5 else 0.01 * r for r in range(n)]
    for link in topology.main_links(n):
        res = run(n, grads, 2, failed_links=[link], start_times=starts)
        assert res.all_done and all(torch.equal(x, whole.results[0]) for x in res.results)  # type: ignore[arg-type]


def test_pipelined_chunks_shorten_the_step_on_the_virtual_clock() -> None:
    # latency per data message in proportion to its size: 4 chunks down a 4-level tree overlap
    n = 15
    grads = grads_for(n, 1, dim=400)
    whole = run(n, grads, None, latency=0.04)
    cut = run(n, grads, 100, latency=0.01)
    assert whole.completion_time is not None and cut.completion_time is not None
    assert cut.completion_time < 0.6 * whole.completion_time


def test_chunk_messages_are_checked() -> None:
    node = FtTreeAllreduce(1, 7, 0, FixedTimeouts(T), chunk_floats=2)
    node.start(torch.zeros(5), 0.0)  # chunks [0, 2), [2, 4), [4, 5)
    bad = [
        CollectiveMsg("data_reduce", 0, 3, 3, None, (3,), torch.ones(2), chunk=0, chunks=2),  # count
        CollectiveMsg("data_reduce", 0, 3, 3, None, (3,), torch.ones(2), chunk=2, chunks=3),  # size
        CollectiveMsg("data_reduce", 0, 3, 3, None, (3,), torch.ones(2), chunk=3, chunks=3),  # index
        CollectiveMsg("data_bcast", 0, 0, 0, None, tuple(range(7)), torch.ones(1), chunk=0, chunks=3),
    ]
    for msg in bad:
        assert node.receive(msg, 0.1) == []
    assert node.rejected == len(bad)
    # all of child 3's chunks in: now (not before) its watchers hear of it
    sends = []
    for k, size in enumerate((2, 2, 1)):
        out = node.receive(CollectiveMsg("data_reduce", 0, 3, 3, None, (3,), torch.ones(size), k, 3), 0.2)
        assert [s.msg.kind for s in out] == ([] if k < 2 else ["meta_reduce_received"] * 2)
        sends += out
    # child 4's chunks: each goes up as soon as it is complete, the backups hear after the last
    for k, size in enumerate((2, 2, 1)):
        out = node.receive(CollectiveMsg("data_reduce", 0, 4, 4, None, (4,), torch.ones(size), k, 3), 0.3)
        ups = [s for s in out if s.msg.kind == "data_reduce"]
        assert [(s.to, s.msg.chunk, s.msg.chunks, s.msg.contributors) for s in ups] == [(0, k, 3, (1, 3, 4))]
        assert ("meta_reduce_sent" in [s.msg.kind for s in out]) == (k == 2)
    # a request is answered with every chunk
    answer = node.receive(CollectiveMsg("meta_reduce_request", 0, 2), 0.4)
    assert [(s.to, s.msg.kind, s.msg.chunk) for s in answer] == [
        (2, "data_reduce_request", k) for k in range(3)
    ]
    with pytest.raises(ConfigError, match="chunk_floats"):
        FtTreeAllreduce(0, 3, 0, FixedTimeouts(T), chunk_floats=0)
