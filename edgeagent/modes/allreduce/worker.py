"""The allreduce mode's half of a run on a worker: a full replica, a shard of the data, and the collective
of every step driven over per-link topics (``link/<from>/<to>``).

The central node starts every step (``AllreduceStep`` on ``run/commit``: the step, its attempt and its
members, rank = index). The device first applies nothing new: its previous step's update was applied when
that step's result came, and a snapshot from before it is kept until the next step starts; if the same
step comes again with a higher attempt (a member died during it), the device restores the snapshot and
runs it again over the new members, so every replica counts every step once. Then it computes the
gradient (summed) of its batch and starts the collective (:mod:`edgeagent.allreduce`) with it: the
collective's messages go out on the links, the ones that arrive go in, and its deadlines are ticked from
the worker's loop (:meth:`AllreduceSession.wait_hint` bounds how long the loop waits for a message). When
the collective has the averaged gradient the device applies it and reports ``AllreduceDone`` with the
digest of its weights; the collective stays alive until it is ``done()`` (its backup duties).

Link failures (``--fail-link``) are injected here, below the collective: a message on a failed link is
not published (:class:`edgeagent.allreduce.links.FailedLinks`). Round trips are measured on every link from
the echoed timestamps of the messages (adaptive timeouts). With ``ps-sync`` / ``ps-async`` the collective
is the central node: the gradient goes to it on ``link/<me>/<central>`` and its model comes back.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from edgeagent.allreduce import BUNDLED
from edgeagent.allreduce.base import Collective, CollectiveMsg, Send
from edgeagent.allreduce.bundle import bundle, unbundle
from edgeagent.allreduce.codec import LinkCodec, gradient_bits
from edgeagent.allreduce.links import AdaptiveTimeouts, FailedLinks, FixedTimeouts
from edgeagent.allreduce.replica import Replica
from edgeagent.allreduce.shards import batch, shard, steps_per_epoch
from edgeagent.compression.base import CompressionError
from edgeagent.data import load_dataset
from edgeagent.errors import EdgeAgentError
from edgeagent.models import ModelSpec
from edgeagent.modes.allreduce.messages import AllreduceDone, AllreduceMsg, AllreduceStep
from edgeagent.protocol.messages import Assign, Message, Ready
from edgeagent.protocol.topics import Family
from edgeagent.roles.worker.run_end import RunEnd
from edgeagent.runtime.role import Handler, Inbound

if TYPE_CHECKING:
    from edgeagent.roles.worker.node import Worker

log = logging.getLogger(__name__)

PS = ("ps-sync", "ps-async")
_MAX_BUFFERED = 4096  # link messages of steps not started here yet (a peer started first)


def make_collective(name: str, rank: int, size: int, step: int, timeouts: Any) -> Collective:
    """The collective called ``name`` for one step (``direct`` here; the others from
    :func:`edgeagent.allreduce.make_collective`)."""
    if name == "direct":
        from edgeagent.allreduce.direct import DirectAllreduce

        return DirectAllreduce(rank, size, step)
    from edgeagent.allreduce import make_collective as make

    return make(name, rank, size, step, timeouts)


class _Active:
    """One step's collective on this device while it lasts."""

    def __init__(self, step: int, attempt: int, members: list[str], collective: Collective | None) -> None:
        self.step, self.attempt, self.members = step, attempt, members
        self.collective = collective
        self.started = time.monotonic()
        self.finished = False  # the result was applied and reported


class AllreduceSession:
    """One device of a data-parallel run (see the module doc)."""

    def __init__(self, worker: Worker, msg: Assign, spec: ModelSpec, settings: dict[str, Any]) -> None:
        self.worker = worker
        self.run_id = msg.run_id
        self.central = msg.worker_list[0]
        self.settings = settings
        self.collective_name = str(settings["collective"])
        self.bundled = self.collective_name in BUNDLED  # metadata folded into fewer messages (bundle.py)
        self.batch_size = int(settings["batch_size"])
        self.seed = msg.seed
        self.replica = Replica(spec, msg.seed, msg.options)
        if msg.weights is not None and "flat" in msg.weights:
            self.replica.load_flat(msg.weights["flat"])
        data = load_dataset(
            str(settings["dataset"]), seed=msg.seed, test_fraction=float(settings["test_fraction"])
        )
        own = getattr(worker.config, "dataset", None)
        if own:  # this device's own data (its .npz): all of it is its shard
            data = load_dataset(own, seed=msg.seed, test_fraction=float(settings["test_fraction"]))
            self.indices = torch.arange(len(data.y_train))
        else:
            workers = msg.worker_list[1:]
            self.indices = shard(
                data.y_train, workers.index(worker.device_id), len(workers), settings["split"], msg.seed
            )
        self.x, self.y = data.x_train, data.y_train
        self.per_epoch = int(
            settings.get("steps_per_epoch") or steps_per_epoch(len(self.indices), 1, self.batch_size)
        )
        self.failed = FailedLinks.parse(settings.get("fail_links", []))
        rank = msg.worker_list.index(worker.device_id)  # each device its own rounding stream
        self.codec = LinkCodec(gradient_bits(str(settings.get("compression", "none"))), seed=msg.seed + rank)
        fixed = settings.get("timeout")
        self.timeouts: FixedTimeouts | AdaptiveTimeouts = (
            FixedTimeouts(float(fixed))
            if fixed
            else AdaptiveTimeouts(floor=float(settings.get("timeout_floor", 0.02)))
        )
        self.active: dict[tuple[int, int], _Active] = {}
        self.current: _Active | None = None
        self.buffered: dict[tuple[int, int], list[tuple[str, AllreduceMsg]]] = {}
        self.undo: tuple[int, tuple[torch.Tensor, dict[int, torch.Tensor]]] | None = None  # (step, snapshot)
        self.grad: tuple[int, torch.Tensor, float, float] | None = None  # (step, grad, loss, seconds)
        self.last_ts: dict[str, tuple[float, float]] = {}  # peer -> (its ts, when it came)
        self.dropped = 0  # messages lost to --fail-link here
        self.steps = 0
        self.loss = 0.0
        self.collective_seconds = 0.0
        self._collect = False  # the current step asked rank 0 for its weights
        self.subscriptions = [worker.topics.links_to(worker.device_id)]
        # Its stop, or the central node's status, ends the run here (roles/worker/run_end.py).
        self.ending = RunEnd(
            worker,
            self.run_id,
            self.central,
            lambda: f"allreduce run {self.run_id} over after {self.steps} steps here",
        )

    # -- set-up and tear-down ------------------------------------------------------------------

    @classmethod
    def open(cls, worker: Worker, msg: Assign) -> AllreduceSession | None:
        if worker.device_id not in msg.worker_list[1:]:
            worker.report_error("assign", f"not in the worker list {msg.worker_list}", msg.run_id)
            return None
        try:
            session = cls(worker, msg, ModelSpec.from_dict(msg.model), dict(msg.settings))
        except (KeyError, TypeError, ValueError, EdgeAgentError) as exc:
            worker.report_error("assign", f"cannot build the allreduce replica: {exc}", msg.run_id)
            return None
        worker.leave_run()
        worker.set_metrics_interval(msg.metrics_interval)
        worker.listen(worker.topics.device(Family.STATUS, session.central))
        for pattern in session.subscriptions:
            worker.listen(pattern)
        worker.times.reset()
        worker.set_status("training", run_id=msg.run_id, stage=0)
        worker.send(
            worker.topics.device(Family.REPLY, worker.device_id),
            Ready(
                run_id=msg.run_id,
                plan_id=msg.plan_id,
                device_id=worker.device_id,
                stage=0,
                parameters=session.replica.size,
            ),
        )
        log.info(
            "%s: allreduce replica of %d parameters, shard of %d samples, collective %s",
            worker.device_id,
            session.replica.size,
            len(session.indices),
            session.collective_name,
        )
        return session

    def close(self) -> None:
        for pattern in self.subscriptions:
            self.worker.stop_listening(pattern)
        self.worker.stop_listening(self.worker.topics.device(Family.STATUS, self.central))

    def handlers(self) -> dict[type[Message], Handler]:
        return {
            AllreduceStep: self._on_step,
            AllreduceMsg: self._on_link,
            **self.ending.handlers(),
        }

    def profile_changed(self) -> None:
        """Nothing here depends on the profile."""

    def metrics(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "mode": "allreduce",
            "collective": self.collective_name,
            "step": self.current.step if self.current else -1,
            "steps": self.steps,
            "loss": round(self.loss, 6),
            "collective_seconds": round(self.collective_seconds, 6),
            "dropped_links": self.dropped,
            "digest": self.replica.digest(),
            "compression_ratio": round(self.codec.ratio, 3),
            "compressed_bytes_saved": self.codec.raw_bytes - self.codec.sent_bytes,
        }
        if isinstance(self.timeouts, AdaptiveTimeouts):
            values["timeouts"] = self.timeouts.summary()
        return values

    # -- the worker's loop ---------------------------------------------------------------------

    def _deadline(self) -> float | None:
        deadlines = [
            d
            for a in self.active.values()
            if a.collective is not None and (d := a.collective.next_deadline()) is not None
        ]
        return min(deadlines) if deadlines else None

    def has_work(self) -> bool:
        deadline = self._deadline()
        return deadline is not None and deadline <= time.monotonic()

    def wait_hint(self) -> float:
        """How long the worker's loop may wait for a message: until the next deadline (at most 0.5 s)."""
        deadline = self._deadline()
        return 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))

    def step(self) -> None:
        now = time.monotonic()
        for active in list(self.active.values()):
            collective = active.collective
            if collective is None:
                continue
            deadline = collective.next_deadline()
            if deadline is not None and deadline <= now:
                self._send(active, collective.tick(now))
                self._settle(active)

    # -- steps ---------------------------------------------------------------------------------

    def _on_step(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, AllreduceStep)
        if msg.run_id != self.run_id or item.sender != self.central:
            return
        cur = self.current
        if cur is not None and (msg.step, msg.attempt) <= (cur.step, cur.attempt):
            return  # a duplicate, or overtaken
        if self.worker.device_id not in msg.members:
            if cur is None:
                return  # assigned to join: the central node names this device in a later step
            log.info("%s: step %d goes on without this device", self.worker.device_id, msg.step)
            self.ending.end(rejoin=True)
            return
        if msg.weights is not None:
            self.replica.load_flat(msg.weights)  # every member loads it: a joiner starts where all are
            self.undo = None
        elif self.undo is not None and self.undo[0] == msg.step:
            self.replica.restore(self.undo[1])  # the step again over other members: undo it first
            self.undo = None
        if self.undo is None or self.undo[0] != msg.step:
            self.undo = (msg.step, self.replica.snapshot())
        active = _Active(msg.step, msg.attempt, list(msg.members), None)
        self.current = active
        self.active = {k: a for k, a in self.active.items() if k[0] >= msg.step - 1 and not self._done(a)}
        self.active[(msg.step, msg.attempt)] = active
        self._collect = msg.collect
        grad = self._gradient(msg.step)[0]
        if self.collective_name in PS:
            self._send_ps_gradient(active, grad)
        else:
            rank = msg.members.index(self.worker.device_id)
            if isinstance(self.timeouts, AdaptiveTimeouts):
                self.timeouts.ranks = list(msg.members)
            active.collective = make_collective(
                self.collective_name, rank, len(msg.members), msg.step, self.timeouts
            )
            active.started = time.monotonic()
            self._send(active, active.collective.start(grad, active.started))
        for sender, early in self.buffered.pop((msg.step, msg.attempt), []):
            self._deliver(active, sender, early)
        self.buffered = {k: v for k, v in self.buffered.items() if k[0] >= msg.step}
        self._settle(active)

    def _done(self, active: _Active) -> bool:
        return active.finished and (active.collective is None or active.collective.done())

    def _gradient(self, step: int) -> tuple[torch.Tensor, float, float]:
        """This device's gradient (summed over its batch) of ``step``; computed once per step."""
        if self.grad is not None and self.grad[0] == step:
            return self.grad[1], self.grad[2], self.grad[3]
        started = time.perf_counter()
        rows = batch(self.indices, step, self.per_epoch, self.batch_size, self.seed)
        grad, loss = self.replica.gradient(self.x[rows], self.y[rows])
        seconds = time.perf_counter() - started
        self.worker.times.compute += seconds
        self.grad = (step, grad, loss, seconds)
        return grad, loss, seconds

    def _settle(self, active: _Active) -> None:
        """Apply and report the step's result once the collective has it."""
        if active.finished or active is not self.current or active.collective is None:
            return
        result = active.collective.result()
        if result is None:
            return
        contributors = getattr(active.collective, "contributors", None)
        ranks = list(contributors()) if callable(contributors) else list(range(len(active.members)))
        self._finish(active, result, ranks)

    def _finish(self, active: _Active, averaged: torch.Tensor | None, contributors: list[int]) -> None:
        seconds = time.monotonic() - active.started
        if averaged is not None:
            self.replica.apply(averaged, self.batch_size)
        active.finished = True
        self.steps += 1
        assert self.grad is not None
        self.loss = self.grad[2] / self.batch_size
        self.collective_seconds = seconds
        rank0 = active.members[0] == self.worker.device_id
        self.worker.send(
            self.worker.topics.device(Family.REPLY, self.worker.device_id),
            AllreduceDone(
                run_id=self.run_id,
                device_id=self.worker.device_id,
                step=active.step,
                attempt=active.attempt,
                digest=self.replica.digest(),
                loss=self.loss,
                samples=self.batch_size,
                contributors=sorted(contributors),
                compute_seconds=self.grad[3],
                collective_seconds=seconds,
                dropped=self.dropped,
                raw_bytes=self.codec.raw_bytes,
                sent_bytes=self.codec.sent_bytes,
                weights=self.replica.flat() if (self._collect and rank0) else None,
            ),
        )

    # -- links ---------------------------------------------------------------------------------

    def _send(self, active: _Active, sends: list[Send]) -> None:
        me = self.worker.device_id
        for s in bundle(sends) if self.bundled else sends:
            if not 0 <= s.to < len(active.members):
                log.error("%s: the collective sent to rank %d of %d", me, s.to, len(active.members))
                continue
            self._publish(active, active.members[s.to], s.msg)

    def _publish(self, active: _Active, peer: str, m: CollectiveMsg) -> None:
        me = self.worker.device_id
        if self.failed.blocked(me, peer, active.step):
            self.dropped += 1
            return
        now = time.monotonic()
        echo, echo_delay = -1.0, 0.0
        if peer in self.last_ts:
            their_ts, came = self.last_ts[peer]
            echo, echo_delay = their_ts, now - came
        msg = AllreduceMsg(
            run_id=self.run_id,
            step=m.step,
            attempt=active.attempt,
            kind=m.kind,
            sender=m.sender,
            origin=-1 if m.origin is None else m.origin,
            target=-1 if m.target is None else m.target,
            contributors=list(m.contributors),
            data=self.codec.encode(m.kind, m.data),  # the reduce direction only (allreduce/codec.py)
            ts=now,
            echo=echo,
            echo_delay=echo_delay,
            chunk=m.chunk,
            chunks=m.chunks,
            notes=[kind for kind, _ in m.notes],
            note_targets=[-1 if target is None else target for _, target in m.notes],
        )
        self.worker.send(self.worker.topics.link(me, peer), msg)

    def _on_link(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, AllreduceMsg)
        if msg.run_id != self.run_id:
            return
        now = time.monotonic()
        self.last_ts[item.sender] = (msg.ts, now)
        if msg.echo >= 0 and isinstance(self.timeouts, AdaptiveTimeouts):
            members = self.current.members if self.current else []
            if item.sender in members:
                self.timeouts.observe(members.index(item.sender), now - msg.echo - msg.echo_delay)
        active = self.active.get((msg.step, msg.attempt))
        if active is not None:
            self._deliver(active, item.sender, msg)
            return
        cur = self.current
        later = cur is None or (msg.step, msg.attempt) > (cur.step, cur.attempt)
        if later and sum(len(v) for v in self.buffered.values()) < _MAX_BUFFERED:
            self.buffered.setdefault((msg.step, msg.attempt), []).append((item.sender, msg))
            return
        self.worker.discard(item, f"step {msg.step} attempt {msg.attempt} is not running here")

    def _deliver(self, active: _Active, sender: str, msg: AllreduceMsg) -> None:
        if msg.kind == "ps_weights":
            if sender == self.central and isinstance(msg.data, torch.Tensor) and not active.finished:
                self.replica.load_flat(msg.data, reset_momentum=False)
                self._finish(active, None, list(msg.contributors))
                if self.collective_name == "ps-async":
                    self._next_async(msg.step + 1)
            return
        if active.collective is None or sender not in active.members:
            return
        if active.members.index(sender) != msg.sender:
            log.warning(
                "%s: %s sent as rank %d; it is rank %d",
                self.worker.device_id,
                sender,
                msg.sender,
                active.members.index(sender),
            )
            return
        try:
            data = self.codec.decode(msg.kind, msg.data, self.replica.size)
        except CompressionError as exc:
            log.warning("%s: dropped a %s from %s: %s", self.worker.device_id, msg.kind, sender, exc)
            return
        if data is not None and (
            not isinstance(data, torch.Tensor) or data.dim() != 1 or data.numel() > self.replica.size
        ):  # a chunk (ring) or the whole vector; the collective checks the rest
            log.warning(
                "%s: dropped a %s from %s: not a flat tensor of at most %d floats",
                self.worker.device_id,
                msg.kind,
                sender,
                self.replica.size,
            )
            return
        cmsg = CollectiveMsg(
            kind=msg.kind,
            step=msg.step,
            sender=msg.sender,
            origin=None if msg.origin < 0 else msg.origin,
            target=None if msg.target < 0 else msg.target,
            contributors=tuple(msg.contributors),
            data=data,
            chunk=msg.chunk,
            chunks=msg.chunks,
            notes=tuple(
                (kind, None if target < 0 else target)
                for kind, target in zip(msg.notes, msg.note_targets, strict=True)
            ),
        )
        now = time.monotonic()
        sends: list[Send] = []
        for one in unbundle(cmsg):  # the message, then the metadata folded into it (bundle.py)
            sends += active.collective.receive(one, now)
        self._send(active, sends)
        self._settle(active)

    # -- the parameter server (ps-sync, ps-async) ----------------------------------------------

    def _send_ps_gradient(self, active: _Active, grad: torch.Tensor) -> None:
        active.started = time.monotonic()
        rank = active.members.index(self.worker.device_id)
        self._publish(
            active,
            self.central,
            CollectiveMsg("ps_grad", active.step, rank, origin=rank, contributors=(rank,), data=grad),
        )

    def _next_async(self, step: int) -> None:
        """ps-async: the next gradient at once, on the model the server sent back (no step message)."""
        cur = self.current
        if cur is None or step >= int(self.settings.get("total_steps", 0)):
            return
        active = _Active(step, 0, cur.members, None)
        self.current = active
        self.active = {(step, 0): active}
        self.undo = None
        grad, _, _ = self._gradient(step)
        self._send_ps_gradient(active, grad)


__all__ = ["AllreduceSession", "make_collective"]
