"""The thesis's fault-tolerant tree allreduce (papers/001, Algorithms 1 and 2), one device's state machine.

Reduce (Algorithm 1): a node adds the sums of its children's subtrees to its gradient and, once every
child is in, sends the sum up (``data_reduce``) and tells its backup nodes (brother, uncle) that it did
(``meta_reduce_sent``). A parent that adds a child's sum tells that child's backup nodes -- its own
brother and its other child -- with ``meta_reduce_received``. A backup node that hears
``meta_reduce_sent`` from ``j`` but not, within ``timeouts.timeout(j)``, ``meta_reduce_received`` about
``j`` asks ``j`` for its sum (``meta_reduce_request``); ``j`` answers with ``data_reduce_request(parent,
sum)`` and the backup node forwards it to ``j``'s parent as ``data_reduce`` (the relay runs over the
backup's main link when it is ``j``'s brother, over the brother link when it is ``j``'s uncle). The root
divides the total by ``size`` once it holds every contributor: that mean is the result.

Broadcast (Algorithm 2): a node that first receives ``data_bcast`` tells its backup nodes
(``meta_bcast_received``), sends the mean to each child and tells each child's backup nodes (the other
child and its own brother) with ``meta_bcast_sent(child)``. A backup node that hears
``meta_bcast_sent(k)`` but not, within ``timeouts.timeout(k)``, ``meta_bcast_received`` from ``k``
sends ``k`` the mean itself.

Note: what the thesis leaves implicit, and what we decided:
- Every data message carries ``contributors`` (the ranks summed in it) and ``origin`` (the child whose
  subtree it is, also when a backup relays it). Line 11 "if not received g'" is: ignore a ``data_reduce``
  whose contributors are already counted; one whose contributors overlap only partly cannot come from a
  correct peer and is dropped (counted in :attr:`FtTreeAllreduce.rejected`). Subtrees are disjoint, so
  each rank is counted exactly once whichever path its sum takes.
- Line 14 ("child != j"): when the sum arrives through a relay, ``j`` is the relay, but the nodes that
  wait for the news are ``origin``'s backups, so we exclude ``origin``, not the relay.
- A ``meta_reduce_request`` that arrives before this node sent its sum is answered once it has.
  The relay checks that the target of a ``data_reduce_request`` is the requester's parent.
- Each backup node relays on its own timeout, so the parent may get a sum twice (brother and uncle);
  the contributors make the second a no-op. Neither request nor relay is retried (as written).
- A node that got the broadcast from a backup node still forwards it to its children (Algorithm 2 runs
  on the first ``data_bcast``, whoever sent it). A backup's broadcast timeout that fires before the
  backup holds the mean itself is remembered and served when the mean arrives.
- Once a node has the mean, every contribution reached the root, so its reduce timeouts are cancelled.
- :meth:`done`: the node has the mean, and for each node it watches (brother, nephews) it got
  ``meta_bcast_received``, served it the mean, or waited one timeout since it got the mean (a
  ``meta_bcast_sent`` still in flight then starts the usual timeout). The driver must keep delivering
  this step's messages until ``done()``, even while the next step runs.
- A node's backup duties do not wait for its own gradient: metadata, timeouts, requests and relays
  are handled before :meth:`start` too; only the data it must add (``data_reduce``, ``data_bcast``)
  is kept until :meth:`start`. Other steps' messages are ignored.
  A child's ``data_reduce`` that arrives before :meth:`start` (this node is still computing) is
  confirmed at once (``meta_reduce_received`` means "I received it", line 13), so a watcher's timeout
  covers the link and not the parent's compute time: a slow parent does not trip spurious relays.

Chunks (issue 54; :mod:`edgeagent.allreduce.chunks`): with ``chunk_floats`` set, every data message
carries one chunk of the vector and the algorithm's data events run per chunk: a node sends chunk k of
its sum up once every child's chunk k is in (a parent adds chunk k while chunk k+1 is on the wire), and
forwards chunk k of the mean to its children as it arrives. Its metadata stays per step: a child's sum
counts as received (``meta_reduce_received``) once all its chunks are in, ``meta_reduce_sent`` follows the
last chunk sent up, ``meta_bcast_received`` / ``meta_bcast_sent`` follow the whole mean, a request is
answered and a late neighbour served with every chunk, and each chunk is deduplicated by its own
contributors. ``chunk_floats=None`` is the paper's exchange: one message per sum and per mean.

Variants: ``"thesis"`` is the above, as written. ``"proactive"`` (the default, ``--collective ft-tree``)
adds one rule: a backup node that learnt in the reduce that ``k``'s main link is down (its data timeout
for ``k`` fired) sends ``k`` the mean as soon as it holds it, instead of waiting for
``meta_bcast_sent(k)`` and a second timeout. The reduce is unchanged, so the mean is the same, exactly;
a link that fails only after the reduce is still caught by the thesis's broadcast timeout.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from edgeagent.allreduce import chunks, topology
from edgeagent.allreduce.base import CollectiveMsg, LinkTimeouts, Send
from edgeagent.allreduce.step import StepCollective
from edgeagent.errors import ConfigError

Variant = Literal["thesis", "proactive"]
VARIANTS: tuple[Variant, ...] = ("thesis", "proactive")
# data kept until start: at most each child's sum by 3 paths (itself, brother, uncle) and a few means
_MAX_EARLY = 16


class FtTreeAllreduce(StepCollective):
    """One device's part in one fault-tolerant tree allreduce step (see the module doc)."""

    label = "ft-tree"

    def __init__(
        self,
        rank: int,
        size: int,
        step: int,
        timeouts: LinkTimeouts,
        *,
        variant: Variant = "proactive",
        chunk_floats: int | None = None,
    ) -> None:
        if variant not in VARIANTS:
            raise ConfigError(f"ft-tree variant {variant!r} is not one of {', '.join(VARIANTS)}")
        if chunk_floats is not None and chunk_floats < 1:
            raise ConfigError(f"ft-tree chunk_floats must be >= 1 or None, got {chunk_floats}")
        super().__init__(rank, size, step, timeouts, max_early=_MAX_EARLY)
        self.node = topology.node(rank, size)
        self.variant: Variant = variant
        self.chunk_floats = chunk_floats
        self._sum: torch.Tensor | None = None
        self._bounds: list[tuple[int, int]] = []  # each chunk's [lo, hi), once started
        self._parts: list[chunks.ChunkSum] = []  # each chunk's running sum
        self._contrib: set[int] = set()  # all ranks once this node holds the mean
        self._received: dict[int, set[int]] = {}  # child -> chunks of its sum received (any path)
        self._confirmed: set[int] = set()  # children whose sum we told their watchers about
        self._up: dict[int, CollectiveMsg] = {}  # chunk -> what we sent up, to answer requests with
        self._sent_up = False  # every chunk went up
        self._requests: list[int] = []  # meta_reduce_request before we sent our sum
        self._mean_buf: torch.Tensor | None = None  # the mean, filled chunk by chunk
        self._mean_have: set[int] = set()
        self._reduce_seen: set[int] = set()  # watched nodes whose sum their parent confirmed
        self._reduce_deadline: dict[int, float] = {}
        self._suspect: set[int] = set()  # watched nodes whose parent link failed in the reduce
        self._bcast_seen: set[int] = set()  # watched nodes that said meta_bcast_received
        self._bcast_served: set[int] = set()  # watched nodes we sent data_bcast to
        self._bcast_deadline: dict[int, float] = {}
        self._bcast_owed: set[int] = set()  # timeout fired before we had the mean
        self._linger: float | None = None
        self._watched = set(topology.watched(rank, size))

    # --- the Collective protocol -------------------------------------------------------------------

    def start(self, grad: torch.Tensor, now: float) -> list[Send]:
        self._sum = self._begin(grad).clone()
        numel = self._sum.numel()
        self._bounds = chunks.bounds(numel, chunks.count(numel, self.chunk_floats))
        self._parts = [
            chunks.ChunkSum(self._sum[lo:hi], self.rank, self.node.children) for lo, hi in self._bounds
        ]
        self._mean_buf = torch.empty_like(self._sum)
        return self._replay_early(self._advance(now), now)

    def receive(self, msg: CollectiveMsg, now: float) -> list[Send]:
        if msg.step != self.step:
            return []
        if not self._started and msg.kind in ("data_reduce", "data_bcast"):
            self._max_early = _MAX_EARLY * min(max(1, msg.chunks), chunks.MAX_CHUNKS)
            return self._ack_early(msg) if self._keep_early(msg) else []
        handler = _HANDLERS.get(msg.kind)
        if handler is None:
            self.rejected += 1
            return []
        return handler(self, msg, now)

    def tick(self, now: float) -> list[Send]:
        out: list[Send] = []
        for j, t in sorted(self._reduce_deadline.items()):
            if t <= now:
                del self._reduce_deadline[j]
                if j not in self._reduce_seen and self._mean is None:
                    self._suspect.add(j)
                    out.append(self._send(j, "meta_reduce_request"))
        for k, t in sorted(self._bcast_deadline.items()):
            if t <= now:
                del self._bcast_deadline[k]
                if k not in self._bcast_seen:
                    out += self._serve(k)
        if self._linger is not None and self._linger <= now:
            self._linger = None
        return out

    def next_deadline(self) -> float | None:
        times = [*self._reduce_deadline.values(), *self._bcast_deadline.values()]
        if self._linger is not None:
            times.append(self._linger)
        return min(times) if times else None

    def done(self) -> bool:
        return self._mean is not None and self.next_deadline() is None and not self._bcast_owed

    def contributors(self) -> tuple[int, ...]:
        """The ranks summed so far on this node, in every chunk (all ranks once it holds the mean)."""
        if self._mean is not None:
            return tuple(sorted(self._contrib))
        if not self._parts:
            return ()
        return tuple(sorted(set.intersection(*(p.contrib for p in self._parts))))

    # --- reduce (Algorithm 1) ----------------------------------------------------------------------

    def _advance(self, now: float) -> list[Send]:
        """Send up (the root: turn into the mean) every chunk whose children are all in; once every
        chunk went up, tell the backups (lines 6-9)."""
        out: list[Send] = []
        if self._sent_up:
            return out
        parent = self.node.parent
        root = parent is None
        for k, part in enumerate(self._parts):
            if not part.complete or k in self._up or (root and k in self._mean_have):
                continue
            if parent is None:
                if part.contrib != set(range(self.size)):
                    raise AssertionError(f"root has contributors {sorted(part.contrib)} of {self.size}")
                out += self._mean_chunk(k, part.data / self.size)
                continue
            up = self._data(parent, "data_reduce", part.data, part.contrib, k)
            self._up[k] = up.msg
            out.append(up)
        if root:
            if len(self._mean_have) == len(self._parts):
                self._sent_up = True
                out += self._on_mean(now)
            return out
        if len(self._up) < len(self._parts):
            return out
        self._sent_up = True
        for b in self.node.backups:  # lines 8-9
            out.append(self._send(b, "meta_reduce_sent", target=parent))
        requests, self._requests = self._requests, []
        for j in requests:
            out += self._answer_request(j)
        return out

    def _on_data_reduce(self, msg: CollectiveMsg, now: float) -> list[Send]:
        origin = msg.sender if msg.origin is None else msg.origin
        if origin not in self.node.children or not self._fits(msg) or not msg.contributors:
            self.rejected += 1
            return []
        assert msg.data is not None
        verdict = self._parts[msg.chunk].offer(origin, frozenset(msg.contributors), msg.data)  # lines 11-12
        if verdict == "bad":
            self.rejected += 1
            return []
        if verdict == "dup":
            return []
        return self._received_chunk(origin, msg.chunk, len(self._parts)) + self._advance(now)

    def _received_chunk(self, origin: int, chunk: int, count: int) -> list[Send]:
        got = self._received.setdefault(origin, set())
        got.add(chunk)
        return self._confirm(origin) if len(got) >= count else []

    def _confirm(self, origin: int) -> list[Send]:
        if origin in self._confirmed:
            return []
        self._confirmed.add(origin)
        tell = [self.node.brother, *(c for c in self.node.children if c != origin)]  # lines 13-14
        return [self._send(x, "meta_reduce_received", target=origin) for x in tell if x is not None]

    def _ack_early(self, msg: CollectiveMsg) -> list[Send]:
        # A child's sum that arrives while this node still computes its own gradient is confirmed at
        # once (all its chunks): the watchers' timeouts then cover the link, not this node's compute time.
        origin = msg.sender if msg.origin is None else msg.origin
        if msg.kind != "data_reduce" or origin not in self.node.children or msg.data is None:
            return []
        if not msg.contributors or not 0 <= msg.chunk < msg.chunks <= chunks.MAX_CHUNKS:
            return []
        return self._received_chunk(origin, msg.chunk, msg.chunks)

    def _on_meta_reduce_received(self, msg: CollectiveMsg, now: float) -> list[Send]:
        if msg.target is not None:  # lines 15-16
            self._reduce_seen.add(msg.target)
            self._reduce_deadline.pop(msg.target, None)
        return []

    def _on_meta_reduce_sent(self, msg: CollectiveMsg, now: float) -> list[Send]:
        j = msg.sender  # lines 17-19
        if j not in self._watched:
            self.rejected += 1
            return []
        if j not in self._reduce_seen and self._mean is None and j not in self._reduce_deadline:
            self._reduce_deadline[j] = now + self.timeouts.timeout(j)
        return []

    def _on_meta_reduce_request(self, msg: CollectiveMsg, now: float) -> list[Send]:
        if not self._sent_up:  # lines 20-21, once we have a sum to give
            self._requests.append(msg.sender)
            return []
        return self._answer_request(msg.sender)

    def _answer_request(self, j: int) -> list[Send]:
        if not self._up or self._mean is not None:  # with the mean, the root has our sum
            return []
        return [
            Send(j, dataclasses.replace(up, kind="data_reduce_request", origin=self.rank))
            for _, up in sorted(self._up.items())
        ]

    def _on_data_reduce_request(self, msg: CollectiveMsg, now: float) -> list[Send]:
        j = msg.sender  # lines 22-23
        k = msg.target
        if k is None or k != topology.parent(j, self.size) or not self._fits(msg):
            self.rejected += 1
            return []
        self._suspect.add(j)
        relay = CollectiveMsg(
            "data_reduce",
            self.step,
            self.rank,
            origin=j,
            contributors=msg.contributors,
            data=msg.data,
            chunk=msg.chunk,
            chunks=msg.chunks,
        )
        return [Send(k, relay)]

    # --- broadcast (Algorithm 2) -------------------------------------------------------------------

    def _on_data_bcast(self, msg: CollectiveMsg, now: float) -> list[Send]:
        if self._mean is not None or msg.chunk in self._mean_have:  # line 6
            return []
        if not self._fits(msg) or set(msg.contributors) != set(range(self.size)):
            self.rejected += 1
            return []
        assert msg.data is not None
        out = self._mean_chunk(msg.chunk, msg.data)
        if len(self._mean_have) == len(self._parts):
            self._contrib = set(msg.contributors)
            out += self._on_mean(now)
        return out

    def _mean_chunk(self, k: int, data: torch.Tensor) -> list[Send]:
        """Chunk ``k`` of the mean is here: keep it and send it on to the children (line 10, per chunk)."""
        assert self._mean_buf is not None
        lo, hi = self._bounds[k]
        chunk = self._mean_buf[lo:hi]
        chunk.copy_(data)
        self._mean_have.add(k)
        everyone = set(range(self.size))
        return [self._data(ch, "data_bcast", chunk, everyone, k) for ch in self.node.children]

    def _on_mean(self, now: float) -> list[Send]:
        """Every chunk of the mean is here (and went on to the children): Algorithm 2's metadata."""
        self._mean = self._mean_buf
        self._contrib = set(range(self.size))
        self._reduce_deadline.clear()
        out = [self._send(b, "meta_bcast_received") for b in self.node.backups]  # lines 7-8
        for ch in self.node.children:  # lines 11-12 (the data went out chunk by chunk)
            for x in (*(c for c in self.node.children if c != ch), self.node.brother):
                if x is not None:
                    out.append(self._send(x, "meta_bcast_sent", target=ch))
        owed = set(self._bcast_owed)
        if self.variant == "proactive":
            owed |= self._suspect
        self._bcast_owed.clear()
        for k in sorted(owed):
            if k not in self._bcast_seen:
                out += self._serve(k)
        unsettled = [w for w in self._watched if not self._settled(w)]
        if unsettled:
            self._linger = now + max(self.timeouts.timeout(w) for w in unsettled)
        return out

    def _on_meta_bcast_received(self, msg: CollectiveMsg, now: float) -> list[Send]:
        self._bcast_seen.add(msg.sender)  # lines 13-14
        self._bcast_deadline.pop(msg.sender, None)
        self._bcast_owed.discard(msg.sender)
        self._check_linger()
        return []

    def _on_meta_bcast_sent(self, msg: CollectiveMsg, now: float) -> list[Send]:
        k = msg.target  # lines 15-17
        if k not in self._watched:
            self.rejected += 1
            return []
        if not self._settled(k) and k not in self._bcast_deadline:
            self._bcast_deadline[k] = now + self.timeouts.timeout(k)
        return []

    def _serve(self, k: int) -> list[Send]:
        if self._mean is None:
            self._bcast_owed.add(k)
            return []
        if k in self._bcast_served:
            return []
        self._bcast_served.add(k)
        self._bcast_deadline.pop(k, None)
        self._check_linger()
        everyone = set(range(self.size))
        return [
            self._data(k, "data_bcast", self._mean[lo:hi], everyone, c)
            for c, (lo, hi) in enumerate(self._bounds)
        ]

    def _settled(self, k: int) -> bool:
        return k in self._bcast_seen or k in self._bcast_served

    def _check_linger(self) -> None:
        if self._linger is not None and all(self._settled(w) for w in self._watched):
            self._linger = None

    # --- helpers -----------------------------------------------------------------------------------

    def _fits(self, msg: CollectiveMsg) -> bool:
        # before start (a relay for a neighbour) the shape is not known here: the parent checks it
        if msg.data is None or not 0 <= msg.chunk < msg.chunks <= chunks.MAX_CHUNKS:
            return False
        if self._sum is None:
            return True
        if msg.chunks != len(self._bounds):
            return False
        lo, hi = self._bounds[msg.chunk]
        return msg.data.shape == (hi - lo,)

    def _send(self, to: int, kind: str, *, target: int | None = None) -> Send:
        return Send(to, CollectiveMsg(kind, self.step, self.rank, target=target))

    def _data(self, to: int, kind: str, data: torch.Tensor, contrib: set[int], chunk: int) -> Send:
        target = to if kind == "data_reduce" else None
        msg = CollectiveMsg(
            kind,
            self.step,
            self.rank,
            self.rank,
            target,
            tuple(sorted(contrib)),
            data,
            chunk,
            len(self._bounds),
        )
        return Send(to, msg)


_HANDLERS = {
    "data_reduce": FtTreeAllreduce._on_data_reduce,
    "meta_reduce_sent": FtTreeAllreduce._on_meta_reduce_sent,
    "meta_reduce_received": FtTreeAllreduce._on_meta_reduce_received,
    "meta_reduce_request": FtTreeAllreduce._on_meta_reduce_request,
    "data_reduce_request": FtTreeAllreduce._on_data_reduce_request,
    "data_bcast": FtTreeAllreduce._on_data_bcast,
    "meta_bcast_received": FtTreeAllreduce._on_meta_bcast_received,
    "meta_bcast_sent": FtTreeAllreduce._on_meta_bcast_sent,
}
