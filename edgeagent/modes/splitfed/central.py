"""Split-federated training's server half (PiPar, papers/003 Algorithm 2 and eq. 3).

The central node is the server: it never holds a device's training data (its data set's test split
evaluates the global model). Every epoch it sends each live device the global model's layers
``[0, P_k)`` with ``(P_k, N_k)`` (:class:`~edgeagent.protocol.messages.SplitRound`) and builds that
device's server-side model, layers ``[P_k, L)``. Activations are handled as they arrive, whichever
device sent them: forward, loss, backward, and the gradient goes back at once; a server-side model
updates once all ``N_k`` mini-batches of an iteration are done, as its device does. When every device
has uploaded its layers (or was left out: it went offline, or went silent for longer than its measured
iterations allow), FedAvg over the complete models weighted by ``|D_k|`` (eq. 3) gives the next global
model. A device that comes back (it announces itself idle) is assigned again and gets the next epoch's
global model.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from edgeagent.compression import CompressionError
from edgeagent.compression.stage import NONE, StageCodecs, restore
from edgeagent.data import Dataset
from edgeagent.errors import PlanningError
from edgeagent.models import ModelSpec, build_layers, build_model, layer_output_shapes, num_layers
from edgeagent.modes.splitfed.choose import (
    ServerProfile,
)
from edgeagent.modes.splitfed.messages import (
    SplitActivation,
    SplitGradient,
    SplitProfile,
    SplitRound,
    SplitUpdate,
    scheduled_parallel,
)
from edgeagent.modes.splitfed.planning import SplitFedPlanning
from edgeagent.pipeline.sgd import SGD
from edgeagent.protocol.messages import Announce, ErrorReport, Message
from edgeagent.protocol.topics import Family
from edgeagent.roles.central.lifecycle import RunLifecycle
from edgeagent.roles.central.report import RunReport
from edgeagent.splitfed.cost import DeviceCosts
from edgeagent.splitfed.fedavg import fedavg, layer_range, shift, state_checksum
from edgeagent.splitfed.server import ServerSteps, auto_threads, server_step

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgeagent.roles.central.node import Central
    from edgeagent.runtime.role import Inbound

log = logging.getLogger("edgeagent.roles.central")
_LATE_HEARTBEATS = 1.0  # seconds a device's heartbeats may come late (on top of three missed intervals)


@dataclass
class ServerSide:
    """One device's server-side model for one epoch: layers ``[split, L)``, trained on its activations."""

    device: str
    split: int
    parallel: int
    model: nn.Sequential
    optimizer: SGD
    sample_shape: tuple[int, ...]  # one row of layer split - 1's output
    done: dict[int, int] = field(default_factory=dict)  # iteration -> mini-batches back-propagated
    received: dict[int, int] = field(default_factory=dict)  # iteration -> mini-batches taken (queued or done)
    compute: float = 0.0
    last_heard: float = field(default_factory=time.monotonic)
    iteration_seconds: float = 0.0  # the longest gap between two of its activations (its deadline's unit)
    started: float = field(default_factory=time.monotonic)  # when its round was sent
    schedule: tuple[int, ...] = ()  # N of each iteration from the first (SplitRound.schedule)
    # Its gradients' codec, with a random stream of its own: a device's stochastic rounding does not
    # depend on when the others' mini-batches came (nor on which thread ran them).
    codecs: StageCodecs = field(default_factory=StageCodecs)

    def parallel_at(self, iteration: int) -> int:
        return scheduled_parallel(self.schedule, self.parallel, iteration)


class SplitFedRun(SplitFedPlanning):
    """One split-federated run on the central node (see the module doc)."""

    def __init__(self, central: Central, data: Dataset, spec: ModelSpec, devices: list[str]) -> None:
        self.central = central
        self.config = central.config
        self.train = central.config.train
        self.data = data
        self.spec = spec
        # Assigning, liveness, checkpoints, events, the report (roles/central/lifecycle.py).
        self.life = RunLifecycle(central, "split-federated", spec, devices, slack=_LATE_HEARTBEATS)
        self.worker_list = self.life.worker_list
        self.devices = self.life.devices
        self.layers = num_layers(spec)
        self.options = self.life.options
        self.global_model = build_model(spec, seed=self.train.seed)
        self.shapes = [tuple(s[1:]) for s in layer_output_shapes(spec)]
        self.plan: dict[str, tuple[int, int]] = {}
        # AccEPT's codecs on the activations (k bits) and their gradients (8 bits): --compression 2|3|4.
        if self.config.compression in ("adaptive", "auto"):
            raise PlanningError(
                f"--compression {self.config.compression} is the pipeline's schedule; split-federated "
                "training takes a fixed width: --compression 2, 3 or 4 (or none)"
            )
        self.forward_bits = NONE if self.config.compression == "none" else int(self.config.compression)
        self.codecs = StageCodecs(backward_bits=NONE if self.forward_bits >= NONE else 8)
        self.plan_info: dict[str, Any] = {}
        self.costs: list[DeviceCosts] | None = None  # what the plan knows of every device (ours: calibrated)
        self.trial_schedules: dict[str, list[int]] = {}  # ours's trial of N, for the next epoch's rounds
        self.tried: dict[str, tuple[int, int]] = {}  # (P, N) a trial measured fastest, per device
        self.server_profile: ServerProfile | None = None
        self.profiles: dict[str, SplitProfile] = {}
        self.assigned: set[str] = set()
        self.epoch = -1
        self.servers: dict[str, ServerSide] = {}
        self.updates: dict[str, SplitUpdate] = {}
        self.left_out: dict[str, str] = {}  # device -> why, this epoch
        self.sent_checksums: dict[str, str] = {}
        self.device_seconds: dict[str, float] = {}  # each device's last epoch, round sent to update in
        self.iterations = 0
        self.loss_sum = 0.0
        self.loss_count = 0
        self.epochs: list[dict[str, Any]] = []
        # The server-side models' mini-batches: in parallel across devices (Fig. 3(c)) or one after another.
        threads = self.config.splitfed_server_threads or auto_threads(len(self.devices))
        self.steps = ServerSteps(threads)
        self.tally = threading.Lock()  # the run's counters, which the server-side threads add to
        self.last_loss = 0.0  # the latest server-side mini-batch's
        self.reported = 0  # iterations the progress hooks were told of (on this node's thread only)

    # -- the CentralRun interface ---------------------------------------------------------------

    def handlers(self) -> dict[type[Message], Callable[[Inbound], None]]:
        return {
            SplitActivation: self._on_activation,
            SplitUpdate: self._on_update,
            Announce: self._on_announce,
            ErrorReport: self._on_error,
            SplitProfile: self._on_profile,
        }

    def metrics(self) -> dict[str, Any] | None:
        return {
            "mode": "split-federated",
            "epoch": self.epoch,
            "participants": sorted(self.servers),
            "plan": {d: list(pn) for d, pn in self.plan.items()},
            "iterations": self.iterations,
            "loss": self.loss_sum / self.loss_count if self.loss_count else None,
        }

    def collect_weights(self) -> dict[str, Any]:
        return {k: v.detach().clone() for k, v in self.global_model.state_dict().items()}

    def save_model(self, path: str) -> bool:
        return self.life.save_model(path, self.collect_weights())

    # -- the run --------------------------------------------------------------------------------

    def execute(self) -> RunReport:
        central = self.central
        central.listen(central.topics.devices(Family.SPLIT_ACTIVATIONS))
        self._profile_server()
        for d in self.devices:
            self._assign(d)
        self._plan()
        report = self.life.report(self.config.splitfed_plan)
        try:
            return self._train(report)
        finally:
            self.steps.close()

    def _train(self, report: RunReport) -> RunReport:
        first = self._resume(report)
        started = time.perf_counter()
        for epoch in range(first, self.train.epochs):
            self._epoch(epoch)
            if epoch + 1 < self.train.epochs:
                self._replan(epoch)
            accuracy, loss = self._evaluate()
            report.test_accuracy_per_epoch.append(accuracy)
            report.test_loss_per_epoch.append(loss)
            self.epochs[-1].update(accuracy=accuracy, test_loss=loss)
            report.train_loss_per_epoch.append(self.epochs[-1]["train_loss"])
            self._checkpoint(epoch, report)
            self.life.event("splitfed-epoch", self.epochs[-1])
            self.life.progress({"accuracy": accuracy})
            log.info("epoch %d: test accuracy %.2f%% (%s)", epoch, 100 * accuracy, self.epochs[-1]["devices"])
        self.life.conclude(report, started, sum(e["samples"] for e in self.epochs))
        report.epochs = self.train.epochs
        report.batches = self.iterations
        report.partitions = [
            {"epoch": e["epoch"], "points": [pn[0] for pn in e["plan"].values()], "plan": e["plan"]}
            for e in self.epochs
        ]
        report.splitfed = {
            "epochs": self.epochs,
            "plan": {d: list(pn) for d, pn in self.plan.items()},
            "planning": self.plan_info,
            "server_threads": self.steps.threads,
        }
        return report

    def _resume(self, report: RunReport) -> int:
        """The first epoch to train: after the checkpoint's (``--resume``), with its model and history."""
        state = self.life.resume(("weights", "epoch", "epochs", "history"))
        if state is None:
            return 0
        self.global_model.load_state_dict(state["weights"])
        self.epochs = list(state["epochs"])
        self.life.resumed(report, state, f"after epoch {state['epoch']}", resumed_from=state["epoch"])
        return int(state["epoch"]) + 1

    def _checkpoint(self, epoch: int, report: RunReport) -> None:
        """The global model after ``epoch`` and the history so far (``--checkpoint``), written atomically."""
        self.life.checkpoint(
            epoch,
            report,
            f"after epoch {epoch}",
            lambda: {"epoch": epoch, "weights": self.collect_weights(), "epochs": self.epochs},
        )

    def _assign(self, device: str) -> None:
        self.central.probes.watch(device)  # echo the probes it measures its link to this node with
        split, _ = self.plan.get(device, (self.layers, 1))
        self.life.assign(
            device,
            worker_list=[self.central.device_id, device],
            points=[0, split, self.layers],
            batches_per_epoch=0,
            batch_size=self.train.batch_size,
        )
        self.assigned.add(device)

    def _epoch(self, epoch: int) -> None:
        participants = self._participants(epoch)
        state = self.collect_weights()
        started = time.perf_counter()
        idle_before = self.central.times.idle
        self._round(epoch, participants, state, self.plan, schedules=self.trial_schedules)
        self._average(
            epoch, participants, time.perf_counter() - started, self.central.times.idle - idle_before
        )

    def _participants(self, epoch: int) -> list[str]:
        """The live assigned devices (waiting for one if none is); a live unassigned one is asked again."""
        central = self.central
        self.epoch = epoch
        self.updates, self.left_out, self.servers = {}, {}, {}
        for d in self.devices:  # a live device not in the run (its announcement lost, say) is asked again
            if d not in self.assigned and self.life.live(d):
                self._assign(d)
        participants = [d for d in self.devices if d in self.assigned and self.life.live(d)]
        if not participants:
            central.wait_until(
                lambda: any(d in self.assigned and self.life.live(d) for d in self.devices),
                max(self.config.restart_window, self.config.batch_timeout),
                f"no device left for epoch {epoch}",
            )
            participants = [d for d in self.devices if d in self.assigned and self.life.live(d)]
        return participants

    def _round(
        self,
        epoch: int,
        participants: list[str],
        state: dict[str, Any],
        plan: dict[str, tuple[int, int]],
        iterations: int = 0,
        schedules: dict[str, list[int]] | None = None,
    ) -> None:
        """Every participant's round (``iterations`` > 0: a trial of that many; ``schedules``: a device's
        N per iteration, ours's trial of N), until each has uploaded its layers or was left out."""
        central = self.central
        for d in participants:
            split, parallel = plan[d]
            server = (
                nn.Sequential(*build_layers(self.spec, split, self.layers, seed=self.train.seed))
                if split < self.layers
                else nn.Sequential()
            )
            if split < self.layers:
                server.load_state_dict(shift(layer_range(state, split, self.layers), -split))
            server.train()
            self.servers[d] = ServerSide(
                d,
                split,
                parallel,
                server,
                SGD(server.parameters(), self.options),
                self.shapes[split - 1],
                schedule=tuple((schedules or {}).get(d, ())),
                codecs=StageCodecs(
                    backward_bits=self.codecs.backward_bits,
                    generator=torch.Generator().manual_seed(
                        (self.train.seed * 1_000_003 + (epoch + 2) * 1009 + self.devices.index(d)) % 2**63
                    ),
                ),
            )
            sent = layer_range(state, 0, split)
            self.sent_checksums[d] = state_checksum(sent)
            central.send(
                central.topics.device(Family.CONTROL, d),
                SplitRound(
                    run_id=central.run_id,
                    epoch=epoch,
                    split=split,
                    parallel=parallel,
                    forward_bits=self.forward_bits,
                    batch_size=self.train.batch_size,
                    tensors=sent,
                    checksum=self.sent_checksums[d],
                    iterations=iterations,
                    schedule=list((schedules or {}).get(d, ())),
                ),
            )
        central.wait_until(
            lambda: all(d in self.updates or d in self.left_out for d in participants),
            math.inf,
            f"epoch {epoch} did not end",
            fault=lambda: self._check(participants),
        )
        self.steps.wait()  # every upload came after its last gradient: at once, unless one was left out

    def _check(self, participants: list[str]) -> None:
        """Leave out (this epoch) a device that went offline or silent; never a fault of the run."""
        now = time.monotonic()
        for d in participants:
            if d in self.updates or d in self.left_out:
                continue
            server = self.servers[d]
            silent = now - server.last_heard
            # Its measured gap between activations; FL sends nothing until its upload: its last epoch's
            # time (and so before a measurement, for a first iteration that may be slow). Unmeasured: the
            # last will and the heartbeats alone.
            gap = server.iteration_seconds if server.split < self.layers else 0.0
            expected = gap or self.device_seconds.get(d, 0.0)
            limit = max(self.config.batch_timeout, self.config.timeout_multiplier * expected)
            if not self.life.live(d) or (expected > 0 and silent > limit):
                why = (
                    "offline" if not self.life.live(d) else f"silent for {silent:.1f} s (limit {limit:.1f} s)"
                )
                self._leave_out(d, why)
        return None

    def _leave_out(self, device: str, why: str) -> None:
        """``device`` (and its server-side model) takes no part in this epoch's FedAvg."""
        self.left_out[device] = why
        self.assigned.discard(device)
        self.servers.pop(device, None)
        log.warning("epoch %d: %s left out of this FedAvg (%s)", self.epoch, device, why)
        self.life.event("splitfed-left-out", {"epoch": self.epoch, "device": device, "reason": why})

    def _average(self, epoch: int, participants: list[str], seconds: float, idle: float) -> None:
        states, weights, devices = [], [], {}
        for d in participants:
            update = self.updates.get(d)
            if update is None or d not in self.servers:
                continue
            server = self.servers[d]
            complete = dict(update.tensors)
            complete.update(shift(server.model.state_dict(), server.split))
            states.append(complete)
            weights.append(float(update.samples))
            devices[d] = {
                "split": server.split,
                "parallel": server.parallel,
                "samples": update.samples,
                "iterations": update.iterations,
                "compute_seconds": update.compute_seconds,
                "idle_seconds": update.idle_seconds,
                "server_compute_seconds": server.compute,
                **(
                    {"schedule": list(server.schedule), "iteration_seconds": update.iteration_seconds}
                    if server.schedule
                    else {}
                ),
                "started_from_global": update.base_checksum == self.sent_checksums.get(d),
            }
        if states:
            self.global_model.load_state_dict(fedavg(states, weights))
        train_loss = self.loss_sum / self.loss_count if self.loss_count else 0.0
        self.epochs.append(
            {
                "epoch": epoch,
                "seconds": seconds,
                "server_idle_seconds": idle,
                "devices": devices,
                "left_out": dict(self.left_out),
                "plan": {d: list(self.plan[d]) for d in participants},
                "samples": sum(int(w) for w in weights),
                "train_loss": train_loss,
            }
        )
        self.loss_sum, self.loss_count = 0.0, 0

    @torch.no_grad()
    def _evaluate(self) -> tuple[float, float]:
        model = self.global_model.eval()
        correct, loss_sum = 0, 0.0
        x, y = self.data.x_test, self.data.y_test
        for lo in range(0, len(x), self.train.eval_batch_size):
            out = model(x[lo : lo + self.train.eval_batch_size])
            target = y[lo : lo + self.train.eval_batch_size]
            loss_sum += float(nn.functional.cross_entropy(out, target, reduction="sum"))
            correct += int((out.argmax(1) == target).sum())
        model.train()
        return correct / max(1, len(x)), loss_sum / max(1, len(x))

    # -- handlers -------------------------------------------------------------------------------

    def _on_activation(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, SplitActivation)
        server = self.servers.get(item.sender)
        if msg.run_id != self.central.run_id or server is None or msg.epoch != self.epoch:
            self.central.discard(item, f"no server-side model of {item.sender!r} for epoch {msg.epoch}")
            return
        try:
            x = restore(msg.x)
        except CompressionError as exc:
            self.central.discard(item, str(exc))
            return
        parallel = server.parallel_at(msg.iteration)
        micro = self.train.batch_size // parallel
        rows = len(msg.y)
        problem = None
        if tuple(x.shape[1:]) != server.sample_shape or len(x) != rows or rows != micro:
            problem = (
                f"activation {tuple(x.shape)} with {rows} labels; expected ({micro}, *{server.sample_shape})"
            )
        elif (
            not torch.isfinite(x).all()
            or msg.y.dtype != torch.int64
            or int(msg.y.min()) < 0
            or int(msg.y.max()) >= self.spec.num_classes
        ):
            problem = "non-finite activation or labels out of range"
        elif not 0 <= msg.micro < parallel or server.received.get(msg.iteration, 0) >= parallel:
            problem = f"mini-batch {msg.micro} of iteration {msg.iteration} is not expected"
        if problem is not None:
            self.central.discard(item, problem)
            return
        now = time.monotonic()
        server.iteration_seconds = (
            max(server.iteration_seconds, now - server.last_heard)
            if server.received
            else server.iteration_seconds
        )
        server.last_heard = now
        server.received[msg.iteration] = server.received.get(msg.iteration, 0) + 1
        self.steps.submit(item.sender, lambda: self._server_step(item.sender, server, msg, x, parallel))
        self._progress()

    def _progress(self) -> None:
        """Tell the progress hooks of the iterations done, on this node's thread (never a server-side
        thread's: a hook may block, and the other devices' mini-batches must go on meanwhile)."""
        with self.tally:
            iterations, loss = self.iterations, self.last_loss
        if iterations != self.reported:
            self.reported = iterations
            self.life.progress({"batch": iterations, "total": self._total(), "loss": loss})

    def _server_step(
        self, device: str, server: ServerSide, msg: SplitActivation, x: torch.Tensor, parallel: int
    ) -> None:
        """One mini-batch on ``device``'s server-side model and its gradient sent back; on a server-side
        thread when they run in parallel (:class:`ServerSteps`: never two of one device's at once)."""
        started = time.perf_counter()
        done = server.done.get(msg.iteration, 0)
        result = server_step(server.model, server.optimizer, x, msg.y, parallel, done)
        server.done[msg.iteration] = done + 1
        seconds = time.perf_counter() - started
        server.compute += seconds
        with self.tally:
            if result.updated:
                self.iterations += 1
                self.last_loss = result.loss
            self.central.times.compute += seconds  # the central node's own account (the report's devices)
            self.loss_sum += result.loss
            self.loss_count += 1
        self.central.send(
            self.central.topics.device(Family.SPLIT_GRADIENTS, device),
            SplitGradient(
                run_id=self.central.run_id,
                epoch=msg.epoch,
                iteration=msg.iteration,
                micro=msg.micro,
                g=server.codecs.gradient(result.grad),
                loss=result.loss,
                correct=result.correct,
            ),
        )

    def _on_update(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, SplitUpdate)
        server = self.servers.get(item.sender)
        if msg.run_id != self.central.run_id or server is None or msg.epoch != self.epoch:
            self.central.discard(item, f"no epoch {msg.epoch} of {item.sender!r} is open")
            return
        expected = {k for k in self.global_model.state_dict() if int(k.split(".")[0]) < server.split}
        if set(msg.tensors) != expected or msg.samples < 1:
            self.central.discard(
                item, f"update with {len(msg.tensors)} entries for layers [0, {server.split})"
            )
            return
        reference = self.global_model.state_dict()
        if any(
            t.shape != reference[k].shape or not torch.isfinite(t).all()
            for k, t in msg.tensors.items()
            if t.is_floating_point()
        ):
            self.central.discard(item, "update tensors of the wrong shape or not finite")
            return
        server.last_heard = time.monotonic()
        self.device_seconds[item.sender] = server.last_heard - server.started
        with self.tally:  # FL's device: the server-side threads may be adding the others' meanwhile
            if server.split >= self.layers:
                self.iterations += msg.iterations
                self.loss_sum += msg.loss_sum
                self.loss_count += msg.iterations
            loss = self.loss_sum / self.loss_count if self.loss_count else 0.0
        self.updates[item.sender] = msg
        self.life.progress({"batch": self.iterations, "total": self._total(), "loss": loss})

    def _on_profile(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, SplitProfile)
        if msg.run_id == self.central.run_id and msg.device_id == item.sender and item.sender in self.devices:
            if len(msg.fwd) != self.layers:
                self.central.discard(item, f"profile of {len(msg.fwd)} layers for a model of {self.layers}")
                return
            self.profiles[item.sender] = msg

    def _on_announce(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Announce)
        # An idle device of the run that is not assigned (left out, restarted) takes the next epoch. From
        # an assigned one it is an announcement sent before its assignment came (discovery's answers);
        # a restart of an assigned device is found by its last will (_check), then its announcement
        # (sent seconds later, once the new process is up) lands here unassigned.
        if msg.device_id in self.devices and msg.busy_with == "" and msg.device_id not in self.assigned:
            log.info("%s is back: it takes the next epoch's global model", msg.device_id)
            self.life.event("splitfed-rejoined", {"epoch": self.epoch, "device": msg.device_id})
            self.life.revive(msg.device_id)  # an announcement is a sign of life: it takes the next epoch
            self._assign(msg.device_id)

    def _on_error(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, ErrorReport)
        if msg.run_id == self.central.run_id:
            log.error("%s: %s", item.sender, msg.reason)
            if msg.code == "assign":
                self.assigned.discard(item.sender)

    def _total(self) -> int | None:
        """Iterations of the whole run (the progress bar's end), once every device said how much data it
        has (its profile); each device runs ``|D_k| // B`` per epoch."""
        if not all(d in self.profiles for d in self.devices):
            return None
        batch = self.train.batch_size
        return self.train.epochs * sum(self.profiles[d].samples // batch for d in self.devices)


__all__ = ["ServerSide", "SplitFedRun"]
