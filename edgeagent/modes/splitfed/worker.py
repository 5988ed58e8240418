"""Split-federated training's device half (PiPar, papers/003 Algorithm 1): the data stays here.

Each epoch starts with a :class:`~edgeagent.protocol.messages.SplitRound` from the server: the global
model's layers ``[0, P)``, the number ``N`` of mini-batches per iteration and the batch size ``B``. For
every iteration over this device's own data (``--dataset FILE.npz``) the session forwards ``N``
mini-batches of ``B // N`` rows one at a time and publishes each output with its labels on its own
``split-act`` topic; the server answers each with the gradient of the loss w.r.t. that output (already
scaled by ``1 / N``), the session back-propagates it as it arrives and, once all ``N`` are in, updates
once. After the last iteration it uploads its layers (:class:`SplitUpdate`) for FedAvg. With ``P`` equal
to the model's depth (FL) it trains the whole model here and sends nothing before the upload.

One unit of work per :meth:`SplitFedSession.step` (a forward of one mini-batch, a backward of one
gradient, or an FL iteration): the worker's loop handles arriving gradients in between, so the next
mini-batch's forward overlaps the previous one's transfer and server compute.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from edgeagent.compression import CompressionError
from edgeagent.compression.stage import StageCodecs, restore
from edgeagent.data import batch_indices
from edgeagent.errors import ConfigError, EdgeAgentError, ProtocolError, TrainingError
from edgeagent.models import ModelSpec, build_layers, num_layers
from edgeagent.modes.splitfed.messages import (
    SplitActivation,
    SplitGradient,
    SplitProfile,
    SplitRound,
    SplitUpdate,
)
from edgeagent.pipeline.sgd import SGD
from edgeagent.protocol.messages import Message
from edgeagent.protocol.options import TrainOptions
from edgeagent.protocol.topics import Family
from edgeagent.roles.worker.run_end import RunEnd
from edgeagent.runtime.compute import Clock, emulate_slowdown, step_clock
from edgeagent.splitfed.fedavg import state_checksum
from edgeagent.splitfed.profile import profile_layers

if TYPE_CHECKING:
    from edgeagent.protocol.messages import Assign
    from edgeagent.roles.worker import Worker
    from edgeagent.runtime.role import Inbound

log = logging.getLogger(__name__)


def load_shard(path: str, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """A device's own training data: ``X`` (float32, one sample of ``spec.in_shape`` per row) and ``y``
    (class indices below ``spec.num_classes``) from a ``.npz``; a :class:`ConfigError` says what is wrong."""
    if not Path(path).is_file():
        raise ConfigError(f"split-federated data set {path!r} does not exist (--dataset FILE.npz)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            x, y = np.asarray(npz["X"], dtype=np.float32), np.asarray(npz["y"]).astype(np.int64)
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"split-federated data set {path!r}: need a .npz with X and y ({exc})") from exc
    if x.shape[1:] != tuple(spec.in_shape) or len(x) != len(y) or len(x) == 0:
        raise ConfigError(
            f"split-federated data set {path!r}: X {x.shape} and y {y.shape} do not fit the model's "
            f"input {tuple(spec.in_shape)} (one label per row, at least one row)"
        )
    if y.min() < 0 or y.max() >= spec.num_classes:
        raise ConfigError(f"{path!r}: labels {y.min()}..{y.max()} outside 0..{spec.num_classes - 1}")
    return torch.from_numpy(x), torch.from_numpy(y)


class Uplink:
    """Sends in order from a thread of its own: an emulated uplink (``--link-mbps``) blocks the sender for
    each message's transfer time, and on a device the network interface sends while the processor
    computes the next mini-batch, so the session's thread must not wait for it (pipelining, Fig. 2)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.queue: queue.SimpleQueue[tuple[str, Message] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"{worker.device_id}-uplink", daemon=True)
        self.thread.start()

    def post(self, topic: str, message: Message) -> None:
        self.queue.put((topic, message))

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                self.worker.send(*item)
            except EdgeAgentError as exc:
                log.error("%s: %s not sent: %s", self.worker.device_id, item[1].KIND.value, exc)

    def close(self) -> None:
        """Send what is queued, then stop."""
        self.queue.put(None)
        self.thread.join(timeout=30.0)


class Downlink:
    """An emulated downlink (``--down-mbps``): each message received occupies it for ``bytes / rate``
    seconds after the one before; the message counts as here only then. The session does other work
    meanwhile (the transfer overlaps computation, as on a real link); 0 Mbit/s: not emulated."""

    def __init__(self, mbps: float) -> None:
        self.bytes_per_second = mbps * 1e6 / 8
        self.free_at = 0.0

    def arrive(self, nbytes: int) -> float:
        """When a message of ``nbytes`` that arrives now has come down the link."""
        now = time.monotonic()
        if self.bytes_per_second <= 0:
            return now
        self.free_at = max(now, self.free_at) + nbytes / self.bytes_per_second
        return self.free_at

    @staticmethod
    def wait_until(ready: float) -> bool:
        """True if ``ready`` has passed; otherwise sleep a little of the rest (the loop comes back)."""
        rest = ready - time.monotonic()
        if rest > 0:
            time.sleep(min(rest, 0.002))
            return False
        return True


class _Round:
    """One epoch of training here, from its ``SplitRound`` to the upload."""

    def __init__(self, msg: SplitRound, spec: ModelSpec, seed: int, options: TrainOptions, rows: int) -> None:
        self.msg = msg
        self.model = nn.Sequential(*build_layers(spec, 0, msg.split, seed=seed))
        self.model.load_state_dict(msg.tensors)
        self.model.train()
        self.optimizer = SGD(self.model.parameters(), options)
        # A trial (negative epoch -1 - t) takes epoch t's order and only its first iterations.
        order = msg.epoch if msg.epoch >= 0 else -1 - msg.epoch
        self.batches = batch_indices(rows, msg.batch_size, epoch=order, seed=seed)
        if msg.iterations:
            self.batches = self.batches[: msg.iterations]
        self.started = time.monotonic()
        self.codecs = StageCodecs(forward_bits=msg.forward_bits)  # a fresh quantizer state every epoch
        self.iteration = 0
        self.next_micro = 0
        self.outputs: dict[int, torch.Tensor] = {}
        self.arrived: dict[int, tuple[float, torch.Tensor]] = {}  # micro -> (when it is here, gradient)
        self.applied = 0
        self.loss_sum = 0.0
        self.correct = 0
        self.compute = 0.0
        self.idle_at_start = 0.0  # the worker's idle seconds (waiting on its inbox) when the round began
        self.iteration_began = self.started
        self.iteration_seconds: list[float] = []  # each iteration's, its first forward to its update

    @property
    def finished(self) -> bool:
        return self.iteration >= len(self.batches)

    @property
    def parallel(self) -> int:
        """N of the current iteration (a trial's schedule may change it from one to the next)."""
        return self.msg.parallel_at(self.iteration)

    @property
    def micro_rows(self) -> int:
        return self.msg.batch_size // self.parallel


class SplitFedSession:
    """The device's half of a split-federated run (see the module doc)."""

    def __init__(self, worker: Worker, assign: Assign, spec: ModelSpec, x: torch.Tensor, y: torch.Tensor):
        self.worker = worker
        self.run_id = assign.run_id
        self.server = assign.worker_list[0]
        self.spec = spec
        self.layers = num_layers(spec)
        self.seed = assign.seed
        self.options = assign.options
        self.x, self.y = x, y
        self.round: _Round | None = None
        self.iterations = 0  # over the session's life (fault injection counts these)
        self.epochs_done = 0
        self.topic = worker.topics.device(Family.SPLIT_ACTIVATIONS, worker.device_id)
        self.grad_topic = worker.topics.device(Family.SPLIT_GRADIENTS, worker.device_id)
        self.batch_size = assign.batch_size
        self.profiled = assign.batch_size < 2  # nothing to profile at: skip the phase
        self.down = Downlink(worker.config.down_mbps)
        self.pending_round: tuple[float, SplitRound] | None = None
        self.uplink = Uplink(worker)
        # Its stop, or the server's status, ends the run here (roles/worker/run_end.py).
        self.ending = RunEnd(
            worker,
            self.run_id,
            self.server,
            lambda: f"split-federated run {self.run_id} over after {self.epochs_done} epochs here",
        )
        worker.times.reset()  # the device's time account (its metrics, the report's devices) is this run's

    @classmethod
    def open(cls, worker: Worker, assign: Assign) -> SplitFedSession | None:
        """The session for ``assign``, or None after reporting why it cannot be (no or a bad data set)."""
        try:
            spec = ModelSpec.from_dict(assign.model)
            if not worker.config.dataset:
                raise ConfigError(
                    f"{worker.device_id} has no data set: split-federated training needs the device's own "
                    "(edgeagent worker --dataset FILE.npz)"
                )
            x, y = load_shard(worker.config.dataset, spec)
        except (ConfigError, ValueError) as exc:
            worker.report_error("assign", str(exc), assign.run_id)
            return None
        worker.leave_run()
        session = cls(worker, assign, spec, x, y)
        worker.listen(session.grad_topic)
        # The server's retained status: "idle" means the run is over, even if its "stop" was lost.
        worker.listen(worker.topics.device(Family.STATUS, session.server))
        worker.set_status("training", run_id=assign.run_id, stage=0)
        log.info(
            "%s: split-federated run %s with %d samples of its own", worker.device_id, assign.run_id, len(x)
        )
        return session

    # -- the WorkerSession interface --------------------------------------------------------------

    def handlers(self) -> dict[type[Message], Callable[[Inbound], None]]:
        return {
            SplitRound: self._on_round,
            SplitGradient: self._on_gradient,
            **self.ending.handlers(),
        }

    def has_work(self) -> bool:
        if not self.profiled or self.pending_round is not None:
            return True
        r = self.round
        if r is None or r.finished:
            return r is not None
        if r.msg.split >= self.layers:
            return True
        return r.next_micro < r.parallel or bool(r.arrived)

    def step(self) -> None:
        if not self.profiled:
            self._profile()
            return
        if self.pending_round is not None:
            ready, msg = self.pending_round
            if not self.down.wait_until(ready):
                return
            self.pending_round = None
            self._start(msg)
        r = self.round
        if r is None:
            return
        if r.finished:
            self._upload(r)
            return
        if r.msg.split >= self.layers:
            self._local_iteration(r)
        elif r.next_micro < r.parallel:
            self._forward(r)
        elif r.arrived and self.down.wait_until(min(at for at, _ in r.arrived.values())):
            self._backward(r)

    def close(self) -> None:
        self.uplink.close()
        self.worker.stop_listening(self.grad_topic)
        self.worker.stop_listening(self.worker.topics.device(Family.STATUS, self.server))
        self.round = None

    def metrics(self) -> dict[str, Any]:
        r = self.round
        return {
            "mode": "split-federated",
            "epoch": r.msg.epoch if r else -1,
            "split": r.msg.split if r else 0,
            "parallel": r.parallel if r else 0,
            "iteration": r.iteration if r else 0,
            "iterations": len(r.batches) if r else 0,
            "epochs_done": self.epochs_done,
            "samples": len(self.x),
        }

    def profile_changed(self) -> None:
        """Nothing here depends on the profile beyond the slowdown, read at every step."""

    # -- handlers -------------------------------------------------------------------------------

    def _on_round(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, SplitRound)
        if msg.run_id != self.run_id or item.sender != self.server:
            return
        if msg.split > self.layers or msg.batch_size > len(self.x):
            raise ProtocolError(
                f"split round of epoch {msg.epoch}: split {msg.split} of {self.layers} layers, batch "
                f"{msg.batch_size} for {len(self.x)} samples here"
            )
        if msg.checksum and state_checksum(msg.tensors) != msg.checksum:
            raise ProtocolError(f"split round of epoch {msg.epoch}: the weights do not match their checksum")
        self.round = None
        self.pending_round = (self.down.arrive(item.size), msg)

    def _start(self, msg: SplitRound) -> None:
        self.round = _Round(msg, self.spec, self.seed, self.options, len(self.x))
        self.round.idle_at_start = self.worker.times.idle
        log.info(
            "%s: epoch %d, layers [0, %d), %d mini-batches of %d, %d iterations",
            self.worker.device_id,
            msg.epoch,
            msg.split,
            self.round.parallel,
            self.round.micro_rows,
            len(self.round.batches),
        )

    def _on_gradient(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, SplitGradient)
        r = self.round
        if item.sender != self.server or r is None or msg.run_id != self.run_id:
            return
        if msg.epoch != r.msg.epoch or msg.iteration != r.iteration or msg.micro not in r.outputs:
            self.worker.discard(item, f"no mini-batch {msg.micro} of iteration {msg.iteration} waits here")
            return
        out = r.outputs[msg.micro]
        try:
            g = restore(msg.g)
        except CompressionError as exc:
            self.worker.discard(item, str(exc))
            return
        if g.shape != out.shape or g.dtype != out.dtype or not torch.isfinite(g).all():
            self.worker.discard(item, f"gradient {tuple(g.shape)} for an output {tuple(out.shape)}")
            return
        r.arrived[msg.micro] = (self.down.arrive(item.size), g)
        r.loss_sum += msg.loss
        r.correct += msg.correct

    # -- work -----------------------------------------------------------------------------------

    def _rows(self, r: _Round, micro: int) -> torch.Tensor:
        index = r.batches[r.iteration]
        return index[micro * r.micro_rows : (micro + 1) * r.micro_rows]

    def _forward(self, r: _Round) -> None:
        if r.next_micro == 0:
            r.iteration_began = time.monotonic()
        rows = self._rows(r, r.next_micro)
        started = Clock(self.worker.slowdown)
        out = r.model(self.x[rows])
        r.compute += emulate_slowdown(started, self.worker.slowdown, self.worker.times)
        r.outputs[r.next_micro] = out
        self.uplink.post(
            self.topic,
            SplitActivation(
                run_id=self.run_id,
                epoch=r.msg.epoch,
                iteration=r.iteration,
                micro=r.next_micro,
                x=r.codecs.activation(out.detach(), epoch=r.msg.epoch),
                y=self.y[rows],
            ),
        )
        r.next_micro += 1

    def _backward(self, r: _Round) -> None:
        if r.applied == 0:
            self.worker.fault_at_backward(self.iterations)
        micro = min(r.arrived, key=lambda m: r.arrived[m][0])
        _, g = r.arrived.pop(micro)
        started = Clock(self.worker.slowdown)
        r.outputs.pop(micro).backward(g)
        r.applied += 1
        if r.applied == r.parallel:
            r.optimizer.step()
            r.optimizer.zero_grad(set_to_none=True)
            self._next_iteration(r)
        r.compute += emulate_slowdown(started, self.worker.slowdown, self.worker.times)

    def _local_iteration(self, r: _Round) -> None:
        """FL: the whole model here, one update per batch."""
        self.worker.fault_at_backward(self.iterations)
        r.iteration_began = time.monotonic()
        rows = r.batches[r.iteration][: r.micro_rows * r.parallel]
        started = Clock(self.worker.slowdown)
        out = r.model(self.x[rows])
        loss = nn.functional.cross_entropy(out, self.y[rows])
        loss.backward()
        r.optimizer.step()
        r.optimizer.zero_grad(set_to_none=True)
        r.compute += emulate_slowdown(started, self.worker.slowdown, self.worker.times)
        r.loss_sum += float(loss.detach())
        r.correct += int((out.argmax(1) == self.y[rows]).sum())
        self._next_iteration(r)

    def _next_iteration(self, r: _Round) -> None:
        r.iteration_seconds.append(time.monotonic() - r.iteration_began)
        r.iteration += 1
        r.next_micro = r.applied = 0
        self.iterations += 1

    def _profile(self) -> None:
        """PiPar's profiling phase here: a few training iterations of the whole model at the run's batch
        size, each layer's times scaled by this device's emulated slowdown; reported to the server."""
        self.profiled = True
        started = time.perf_counter()
        factor = self.worker.slowdown
        times, _, _ = profile_layers(
            self.spec,
            self.batch_size,
            iterations=3,
            seed=self.seed,
            fit_fixed=True,
            clock=step_clock(factor),
        )
        config = self.worker.config
        try:  # the link to the server along the real path (the emulated uplink included)
            up, latency = self.worker.probes.measure(self.server, timeout=10.0)
        except TrainingError as exc:
            log.warning("%s: link to %s not measured (%s)", self.worker.device_id, self.server, exc)
            up, latency = 0.0, 0.0
        self.worker.send(
            self.worker.topics.device(Family.REPLY, self.worker.device_id),
            SplitProfile(
                run_id=self.run_id,
                device_id=self.worker.device_id,
                fwd=[t * factor for t in times.fwd],
                bwd=[t * factor for t in times.bwd],
                samples=len(self.x),
                up_bps=up,
                down_bps=config.down_mbps * 1e6 / 8,
                seconds=time.perf_counter() - started,
                latency=latency,
                fwd_fixed=[t * factor for t in times.fwd_fixed],
                bwd_fixed=[t * factor for t in times.bwd_fixed],
            ),
        )

    def _upload(self, r: _Round) -> None:
        state = {k: v.detach().clone() for k, v in r.model.state_dict().items()}
        self.uplink.post(
            self.worker.topics.device(Family.REPLY, self.worker.device_id),
            SplitUpdate(
                run_id=self.run_id,
                epoch=r.msg.epoch,
                device_id=self.worker.device_id,
                samples=len(self.x),
                iterations=len(r.batches),
                tensors=state,
                base_checksum=r.msg.checksum,
                loss_sum=r.loss_sum,
                correct=r.correct,
                compute_seconds=r.compute,
                idle_seconds=self.worker.times.idle - r.idle_at_start,
                train_seconds=time.monotonic() - r.started,
                iteration_seconds=r.iteration_seconds,
            ),
        )
        if not r.msg.iterations:  # a trial of the exhaustive search is no epoch
            self.epochs_done += 1
        self.round = None


__all__ = ["SplitFedSession", "load_shard"]
