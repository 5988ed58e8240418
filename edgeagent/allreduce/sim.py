"""An in-memory, discrete-event driver for the collectives (pure): one allreduce step on a virtual clock.

:func:`run_step` delivers each :class:`~edgeagent.allreduce.base.Send` after a fixed virtual latency
(``latency`` for a message with data, ``meta_latency`` for metadata), drops every message on a failed
link in both directions (as the transport does), and calls ``tick`` when a collective's deadline comes.
It records when each rank got the mean, how many messages of each kind were sent and dropped. There is
no bandwidth model: a node's messages do not queue behind each other, so virtual times count hops and
timeouts, not bytes.

:func:`isolation_stats` is the thesis's Fig. 11 experiment on the pure topology: remove random links of
the fault-tolerant tree (main and backup) until some node cannot reach the root over the links left.

``FAULTS`` are the thesis's fault cases (§7.2, Fig. 12) as we place them: one failed link (3-1, Fig. 8's),
two parallel failures at the same height (3-1 and 5-2) and two serial failures at consecutive heights
(3-1 and 1-0); they need at least 7 nodes.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import random
from collections.abc import Iterable, Sequence

import torch

from edgeagent.allreduce import make_collective, topology
from edgeagent.allreduce.base import Collective, CollectiveMsg, Send
from edgeagent.allreduce.bundle import bundle, unbundle
from edgeagent.errors import ConfigError

FAULTS: dict[str, tuple[tuple[int, int], ...]] = {
    "none": (),
    "1": ((3, 1),),
    "2-parallel": ((3, 1), (5, 2)),
    "2-serial": ((3, 1), (1, 0)),
}


@dataclasses.dataclass(frozen=True)
class FixedTimeouts:
    """The thesis's fixed timeout, the same on every link."""

    seconds: float

    def timeout(self, peer: int) -> float:
        return self.seconds


@dataclasses.dataclass(frozen=True)
class SimResult:
    """What one simulated step produced."""

    results: list[torch.Tensor | None]  # each rank's mean (None: it never got it)
    result_times: list[float | None]  # virtual time each rank got it
    completion_time: float | None  # when the last rank got it; None if any rank stalled
    contributors: list[tuple[int, ...]]  # ranks summed in each rank's mean (tree collectives)
    sent: dict[str, int]  # messages sent, by kind
    dropped: int  # messages lost on failed links
    all_done: bool  # every collective reported done()
    messages: int = 0  # messages put on the links (fewer than ``sent`` in all when bundled)


def run_step(
    collectives: Sequence[Collective],
    grads: Sequence[torch.Tensor],
    *,
    failed_links: Iterable[tuple[int, int]] = (),
    late_failures: Iterable[tuple[int, int, float]] = (),
    latency: float = 0.01,
    meta_latency: float = 0.001,
    jitter: float = 0.0,
    seed: int = 0,
    start_times: Sequence[float] | None = None,
    max_time: float = 120.0,
    bundled: bool = False,
) -> SimResult:
    """Run one step of ``collectives`` (rank ``i`` is ``collectives[i]``), all started at time 0.

    ``failed_links`` are down from the start, ``late_failures`` ``(a, b, t)`` from virtual time ``t``.
    ``jitter`` stretches each message's latency by a random factor in ``[1, 1 + jitter)`` (seeded), so
    messages overtake each other, also on one link. ``start_times`` (default all 0) model devices that
    finish their gradient at different times. ``bundled``: each batch of sends goes through
    :func:`~edgeagent.allreduce.bundle.bundle` and each message through ``unbundle`` on arrival, as the
    MQTT driver does for :data:`~edgeagent.allreduce.BUNDLED` collectives (``sent`` still counts every
    message of the collective's, ``messages`` what went on the links).
    """
    n = len(collectives)
    if len(grads) != n:
        raise ConfigError(f"{len(grads)} gradients for {n} collectives")
    failed = {frozenset(link): 0.0 for link in failed_links}
    failed.update({frozenset((a, b)): t for a, b, t in late_failures})
    queue: list[tuple[float, int, int, CollectiveMsg | str]] = []  # (time, seq, rank, msg|"tick"|"start")
    seq = 0
    pushed: list[float | None] = [None] * n
    result_times: list[float | None] = [None] * n
    sent: collections.Counter[str] = collections.Counter()
    dropped = messages = 0
    rng = random.Random(seed)

    def after(rank: int, sends: list[Send], now: float) -> None:
        nonlocal seq, dropped, messages
        for s in bundle(sends) if bundled else sends:
            sent.update([s.msg.kind, *(kind for kind, _ in s.msg.notes)])
            messages += 1
            if failed.get(frozenset((rank, s.to)), now + 1.0) <= now:
                dropped += 1
                continue
            delay = latency if s.msg.data is not None else meta_latency
            if jitter > 0:
                delay *= 1.0 + jitter * rng.random()
            seq += 1
            heapq.heappush(queue, (now + delay, seq, s.to, s.msg))
        if result_times[rank] is None and collectives[rank].result() is not None:
            result_times[rank] = now
        deadline = collectives[rank].next_deadline()
        if deadline is not None and deadline != pushed[rank]:
            pushed[rank] = deadline
            seq += 1
            heapq.heappush(queue, (max(deadline, now), seq, rank, "tick"))

    starts = [0.0] * n if start_times is None else list(start_times)
    if len(starts) != n:
        raise ConfigError(f"{len(starts)} start times for {n} collectives")
    for r in range(n):
        seq += 1
        heapq.heappush(queue, (starts[r], seq, r, "start"))
    while queue:
        now, _, rank, item = heapq.heappop(queue)
        if now > max_time:
            break
        c = collectives[rank]
        if item == "start":
            after(rank, c.start(grads[rank], now), now)
        elif item == "tick":
            pushed[rank] = None
            after(rank, c.tick(now), now)
        else:
            assert isinstance(item, CollectiveMsg)
            after(rank, [s for one in unbundle(item) for s in c.receive(one, now)], now)
    results = [c.result() for c in collectives]
    complete = all(t is not None for t in result_times)
    return SimResult(
        results=results,
        result_times=result_times,
        completion_time=max(t for t in result_times if t is not None) if complete else None,
        contributors=[tuple(getattr(c, "contributors", lambda: ())()) for c in collectives],
        sent=dict(sent),
        dropped=dropped,
        all_done=all(c.done() for c in collectives),
        messages=messages,
    )


def simulate(
    name: str,
    grads: Sequence[torch.Tensor],
    *,
    timeout: float = 0.5,
    failed_links: Iterable[tuple[int, int]] = (),
    late_failures: Iterable[tuple[int, int, float]] = (),
    latency: float = 0.01,
    meta_latency: float = 0.001,
    jitter: float = 0.0,
    seed: int = 0,
    start_times: Sequence[float] | None = None,
    step: int = 0,
    bundled: bool = False,
) -> SimResult:
    """One step of the collective ``name`` over ``len(grads)`` ranks with a fixed timeout (``bundled``:
    see :func:`run_step`)."""
    n = len(grads)
    timeouts = FixedTimeouts(timeout)
    collectives = [make_collective(name, r, n, step, timeouts) for r in range(n)]
    return run_step(
        collectives,
        grads,
        failed_links=failed_links,
        late_failures=late_failures,
        latency=latency,
        meta_latency=meta_latency,
        jitter=jitter,
        seed=seed,
        start_times=start_times,
        bundled=bundled,
    )


@dataclasses.dataclass(frozen=True)
class IsolationStats:
    """Fig. 11: failed links until a node is isolated, averaged over random removal orders."""

    height: int
    nodes: int
    links: int  # main + backup links in the tree
    mean_failed: float  # (a) average number of failed links when the first node is cut off
    share: float  # (b) that number over ``links``


def ft_tree_links(size: int) -> list[tuple[int, int]]:
    """Every link of the fault-tolerant tree, main then backup."""
    return [*topology.main_links(size), *topology.backup_links(size)]


def isolation_stats(height: int, trials: int, seed: int) -> IsolationStats:
    """Remove the links of a complete tree of ``height`` in random order until a node cannot reach the
    root; average the number removed (counting the one that cut the node off) over ``trials``."""
    if height < 1 or trials < 1:
        raise ConfigError(f"isolation_stats needs height >= 1 and trials >= 1, got {height}, {trials}")
    size = 2 ** (height + 1) - 1
    links = ft_tree_links(size)
    rng = random.Random(seed)
    total = 0
    for _ in range(trials):
        order = links[:]
        rng.shuffle(order)
        total += _failed_until_isolated(size, order)
    return IsolationStats(height, size, len(links), total / trials, total / trials / len(links))


def _failed_until_isolated(size: int, order: list[tuple[int, int]]) -> int:
    # Removing order[0], order[1], ... : the graph of the links left is connected exactly while
    # order[k:] connects all nodes. Add links back from the end (union-find) until it connects: if
    # that happens when order[j] is added, removing order[0..j] is the first removal that cuts a node.
    root = list(range(size))

    def find(x: int) -> int:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    parts = size
    for j in range(len(order) - 1, -1, -1):
        a, b = find(order[j][0]), find(order[j][1])
        if a != b:
            root[a] = b
            parts -= 1
            if parts == 1:
                return j + 1
    return 0  # never connected (a single node): nothing to cut
