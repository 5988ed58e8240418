"""The allreduce mode's half of a run on the central node: it assigns the ranks, starts every step, watches
the members, evaluates a replica after every epoch and writes the run report.

Steps are started by the central node (``AllreduceStep`` on ``run/commit``) rather than free-run on the
devices: one message per step (the collective's own traffic is ``2 (n - 1)`` messages and more), and it
makes membership changes atomic. A step is over when every member reported ``AllreduceDone``; the
devices apply a step's update when its result comes and keep a snapshot until the next step starts. If a
member dies during a step (its last will, or heartbeats that stopped), the step is run again over the live
members with a higher ``attempt``, and every device first undoes what it applied of it: no contribution is
lost or counted twice. A device that comes back (it announces itself idle) is assigned again and joins at
the next step with the current model (the step's ``weights``, which every member loads, so momentum
restarts alike everywhere). A step that does not end within its deadline (a multiple of the median step
time, with a floor) is run again; after three tries the run stops with the reason.

``--checkpoint FILE``: after every epoch (rank 0's weights, just evaluated) the model, the last step and
the run's identity (its id, the digest of the settings that decide what a step computes) are written
atomically; ``--resume FILE``: a new central node goes on from the next step, every member loading the
checkpoint's weights with that step as a joiner does.

``ps-sync``: the central node is the parameter server: it waits for every member's gradient, averages them
in rank order, applies them and sends its model back. ``ps-async``: it applies every gradient as it
arrives (scaled by 1/n for n devices, so that n gradients move the model as one synchronous step does)
and sends the current model back to that device, which goes on at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from edgeagent.allreduce.links import FailedLinks
from edgeagent.allreduce.replica import Replica
from edgeagent.allreduce.shards import shard, steps_per_epoch
from edgeagent.errors import TrainingError
from edgeagent.modes.allreduce.messages import AllreduceDone, AllreduceMsg, AllreduceStep
from edgeagent.protocol.messages import Announce, ErrorReport, Message, Ready
from edgeagent.protocol.topics import Family
from edgeagent.roles.central.lifecycle import RunLifecycle
from edgeagent.roles.central.report import RunReport
from edgeagent.runtime.role import Inbound

if TYPE_CHECKING:
    from edgeagent.data import Dataset
    from edgeagent.models import ModelSpec
    from edgeagent.roles.central import Central

log = logging.getLogger(__name__)

_TRIES = 3  # a step that times out this many times in a row stops the run
_STEP_FLOOR = 10.0  # seconds: the least a step may take before it is run again
_STEP_MULTIPLE = 20.0  # a step's deadline: this many times the median step so far (and the floor)
# The settings that decide what a step computes: a checkpoint resumes only a run that agrees on them.
_IDENTITY = ("collective", "batch_size", "dataset", "test_fraction", "split", "steps_per_epoch")
# Seconds a member's heartbeats may come late before it is excluded (on top of three missed intervals):
# a crash is its last will, at once; silence counts only when long, since on a loaded machine (31 devices
# on 2 cores) heartbeats come late, and excluding a live device costs a step.
_LATE_HEARTBEATS = 10.0


class AllreduceRun:
    """One data-parallel run over the discovered devices (see the module doc)."""

    def __init__(self, central: Central, data: Dataset, spec: ModelSpec, devices: list[str]) -> None:
        self.central = central
        self.config = config = central.config
        self.train = config.train
        self.data = data
        self.spec = spec
        # Assigning, the ready barrier, liveness, checkpoints, events, the report (roles/central/lifecycle).
        self.life = RunLifecycle(central, "allreduce", spec, list(devices), slack=_LATE_HEARTBEATS)
        self.worker_list = self.life.worker_list
        self.devices = self.life.devices
        self.options = self.life.options
        self.ready = self.life.ready  # devices that built their replicas (the lifecycle's barrier)
        self.replica = Replica(spec, self.train.seed, self.options)  # evaluation; the server's model in ps-*
        self.collective = config.collective
        self.failed = FailedLinks.parse(config.fail_links)
        smallest = min(
            len(shard(data.y_train, i, len(self.devices), config.split, self.train.seed))
            for i in range(len(self.devices))
        )
        self.per_epoch = steps_per_epoch(smallest, 1, self.train.batch_size)
        self.total = self.per_epoch * self.train.epochs
        if self.train.max_batches is not None:
            self.total = min(self.total, self.train.max_batches)
        self.members = list(self.devices)
        self.done: dict[str, AllreduceDone] = {}
        self.step, self.attempt = -1, 0
        self.weights: torch.Tensor | None = None  # rank 0's flat weights after ``weights_step``
        self.weights_step = -1
        self.joiners: list[str] = []
        self.resumed = False  # the first step sends the checkpoint's weights (``--resume``)
        self.restarted: set[str] = set()  # members that announced themselves idle: they lost the run
        self.grads: dict[str, torch.Tensor] = {}  # ps-sync: this step's gradients
        self.applied = 0  # ps-async: gradients applied
        self.async_done: dict[str, int] = {}  # ps-async: steps each device finished
        self.iterations: list[dict[str, Any]] = []
        self.durations: list[float] = []

    # -- the CentralRun interface ---------------------------------------------------------------

    def handlers(self) -> dict[type[Message], Callable[[Inbound], None]]:
        return {
            Ready: self.life.on_ready,
            AllreduceDone: self._on_done,
            AllreduceMsg: self._on_link,
            Announce: self._on_announce,
            ErrorReport: self._on_error,
        }

    def metrics(self) -> dict[str, Any] | None:
        last = self.iterations[-1] if self.iterations else {}
        return {
            "mode": "allreduce",
            "collective": self.collective,
            "step": self.step,
            "total": self.total,
            "members": list(self.members),
            "step_seconds": last.get("seconds"),
            "loss": last.get("loss"),
        }

    def collect_weights(self) -> dict[str, Any]:
        return dict(self.replica.collect_state())

    def save_model(self, path: str) -> bool:
        return self.life.save_model(path, self.collect_weights())

    # -- the run --------------------------------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        c = self.config
        return {
            "collective": self.collective,
            "batch_size": self.train.batch_size,
            "dataset": self.train.dataset,
            "test_fraction": self.train.test_fraction,
            "split": c.split,
            "steps_per_epoch": self.per_epoch,
            "total_steps": self.total,
            "timeout": c.allreduce_timeout,
            "timeout_floor": c.allreduce_timeout_floor,
            "fail_links": list(c.fail_links),
            "compression": c.compression,  # the reduce direction's gradients (allreduce/codec.py)
        }

    def _assign(self, device: str) -> None:
        self.life.assign(
            device,
            worker_list=list(self.worker_list),
            points=[0, len(list(self.replica.model.children()))],
            batches_per_epoch=self.per_epoch,
            settings=self._settings(),
        )

    def execute(self) -> RunReport:
        central = self.central
        central.listen(central.topics.links_to(central.device_id))
        for d in self.devices:
            self._assign(d)
        self.life.await_ready("build their replicas")
        report = self.life.report("data-parallel")
        first = self._resume(report)
        started = time.perf_counter()
        if self.collective == "ps-async":
            self._run_async(report, first)
        else:
            for step in range(first, self.total):
                self._run_step(step)
                if (step + 1) % self.per_epoch == 0 or step + 1 == self.total:
                    self._end_epoch(report, step)
        self.life.conclude(report, started, sum(it.get("samples", 0) for it in self.iterations))
        report.batches = self.total
        report.epochs = len(report.test_accuracy_per_epoch)
        seconds = [it["seconds"] for it in self.iterations]
        # Every device holds the whole model (one "stage" of all layers); the members per step are in
        # ``allreduce["iterations"]``.
        layers = len(list(self.replica.model.children()))
        report.partitions = [{"batch": 0, "points": [0, layers], "members": list(self.devices)}]
        report.timeline = [
            {"step": it["step"], "seconds": it["seconds"], "collective": it["collective_seconds"]}
            for it in self.iterations
        ]
        last = self.iterations[-1] if self.iterations else {}
        if last.get("sent_bytes"):  # the devices' totals so far: the last step's are the run's
            ratio = last["raw_bytes"] / last["sent_bytes"]
            report.compression_ratio = report.compression_ratio_tensors = ratio
        report.allreduce = {
            "collective": self.collective,
            "timeout": self.config.allreduce_timeout,
            "split": self.config.split,
            "fail_links": list(self.config.fail_links),
            "steps_per_epoch": self.per_epoch,
            "median_step_seconds": statistics.median(seconds) if seconds else 0.0,
            "iterations": self.iterations,
            "events": self.life.events,
        }
        return report

    def _end_epoch(self, report: RunReport, step: int) -> None:
        if self.collective != "ps-sync" and self.weights is not None:
            self.replica.load_flat(self.weights)
        accuracy, loss = self.replica.evaluate(self.data.x_test, self.data.y_test)
        report.test_accuracy_per_epoch.append(accuracy)
        report.test_loss_per_epoch.append(loss)
        epoch = [it["loss"] for it in self.iterations if it["epoch"] == step // self.per_epoch]
        report.train_loss_per_epoch.append(sum(epoch) / len(epoch) if epoch else 0.0)
        self.life.event(
            "allreduce-epoch", {"epoch": step // self.per_epoch, "accuracy": accuracy, "loss": loss}
        )
        self.life.progress({"accuracy": accuracy})
        log.info("epoch %d: test accuracy %.2f%%", step // self.per_epoch, 100 * accuracy)
        self._checkpoint(report, step)

    # -- checkpoints ----------------------------------------------------------------------------

    def _identity(self) -> str:
        """The digest of what decides a step's result: a checkpoint resumes only a run that computes alike."""
        settings = self._settings()
        ident = {k: settings[k] for k in _IDENTITY} | {"devices": self.devices, "model": self.spec.to_dict()}
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]

    def _checkpoint(self, report: RunReport, step: int) -> None:
        """The model after ``step`` (rank 0's, just evaluated) and the run so far (``--checkpoint``)."""
        self.life.checkpoint(
            step,
            report,
            f"after step {step}",
            lambda: {
                "step": step,
                "epoch": step // self.per_epoch,
                "weights": self.replica.flat(),
                "config_digest": self._identity(),
                "iterations": self.iterations,
                "events": self.life.events,
            },
        )

    def _resume(self, report: RunReport) -> int:
        """The first step to run: 0, or the one after the checkpoint's (``--resume``), with its model."""
        state = self.life.resume(
            ("run_id", "step", "weights", "config_digest", "history", "iterations", "events")
        )
        if state is None:
            return 0
        weights, step = state["weights"], state["step"]
        if not isinstance(weights, torch.Tensor) or weights.numel() != self.replica.size:
            got = weights.numel() if isinstance(weights, torch.Tensor) else type(weights).__name__
            raise TrainingError(f"--resume: the checkpoint holds {got} weights, not {self.replica.size}")
        if state["config_digest"] != self._identity():
            raise TrainingError(
                f"--resume: the checkpoint is of a run with other settings (digest {state['config_digest']}, "
                f"this one {self._identity()}): give the same --collective, --split and devices"
            )
        if not isinstance(step, int) or not 0 <= step < self.total:
            raise TrainingError(f"--resume: the checkpoint's step {step} is not in 0..{self.total - 1}")
        self.replica.load_flat(weights.float())
        self.weights, self.weights_step, self.resumed = self.replica.flat(), step, True
        self.iterations, self.life.events = list(state["iterations"]), list(state["events"])
        self.life.resumed(
            report, state, f"at step {step + 1}", resumed_from=step, checkpoint=self.config.resume
        )
        self.life.event("allreduce-resumed", {"step": step + 1, "digest": self.replica.digest()})
        return step + 1

    # -- one synchronous step ---------------------------------------------------------------------

    def _deadline(self) -> float:
        recent = self.durations[-20:]
        return max(_STEP_FLOOR, _STEP_MULTIPLE * statistics.median(recent)) if recent else 60.0

    def _run_step(self, step: int) -> None:
        central = self.central
        epoch_end = (step + 1) % self.per_epoch == 0 or step + 1 == self.total
        tries, started = 0, time.perf_counter()
        self.step, self.attempt = step, 0
        weights = self._take_joiners(step)
        if self.resumed:  # the first step after --resume: every member starts from the checkpoint's model
            weights, self.resumed = self.weights, False
        while True:
            self.done, self.grads = {}, {}
            central.send(
                central.topics.fixed(Family.COMMIT),
                AllreduceStep(
                    run_id=central.run_id,
                    step=step,
                    attempt=self.attempt,
                    members=list(self.members),
                    epoch=step // self.per_epoch,
                    collect=epoch_end or bool(self.joiners),
                    weights=weights,
                    weights_step=self.weights_step if weights is not None else -1,
                ),
            )
            try:
                dead = central.wait_until(
                    lambda: set(self.done) >= set(self.members),
                    self._deadline(),
                    lambda: (
                        f"step {step} (attempt {self.attempt}): no result from "
                        f"{sorted(set(self.members) - set(self.done))}"
                    ),
                    fault=lambda: (
                        [d for d in self.members if not self.life.live(d) or d in self.restarted] or None
                    ),
                )
            except TrainingError as exc:
                tries += 1
                if tries >= _TRIES:
                    raise
                log.warning("%s; running it again", exc)
                self.life.event(
                    "allreduce-retry", {"step": step, "attempt": self.attempt, "reason": str(exc)}
                )
                self.attempt += 1
                continue
            if dead:
                self.restarted -= set(dead)
                self.members = [d for d in self.members if d not in dead]
                log.warning("step %d: %s gone; the step runs again over %s", step, dead, self.members)
                self.life.event(
                    "allreduce-excluded", {"step": step, "devices": dead, "members": self.members}
                )
                if not self.members:
                    raise TrainingError(f"step {step}: no device left ({dead} gone)")
                self.attempt += 1
                if weights is not None and any(d in dead for d in self.members):
                    weights = None
                continue
            break
        self._record(step, time.perf_counter() - started)

    def _take_joiners(self, step: int) -> torch.Tensor | None:
        """Devices that came back and are ready join at this step with the weights after the last one."""
        ready = [d for d in self.joiners if d in self.ready and self.life.live(d)]
        if not ready or self.weights is None or self.weights_step != step - 1:
            return None
        self.joiners = [d for d in self.joiners if d not in ready]
        self.members = [d for d in self.devices if d in self.members or d in ready]
        self.life.event("allreduce-joined", {"step": step, "devices": ready, "members": self.members})
        log.info("step %d: %s join with the current model", step, ready)
        return self.weights

    def _record(self, step: int, seconds: float) -> None:
        dones = [self.done[d] for d in self.members]
        digests = sorted({d.digest for d in dones})
        if len(digests) != 1:
            log.error("step %d: the replicas differ: %s", step, {d.device_id: d.digest for d in dones})
        self.durations.append(seconds)
        entry = {
            "step": step,
            "attempt": self.attempt,
            "epoch": step // self.per_epoch,
            "seconds": seconds,
            "collective_seconds": max(d.collective_seconds for d in dones),
            "compute_seconds": max(d.compute_seconds for d in dones),
            "loss": sum(d.loss for d in dones) / len(dones),
            "samples": sum(d.samples for d in dones),
            "members": list(self.members),
            "digests": {d.device_id: d.digest for d in dones},
            "contributors": {d.device_id: list(d.contributors) for d in dones},
            "failed_links": self.failed.failed_at(step),
            "dropped": sum(d.dropped for d in dones),
            "raw_bytes": sum(d.raw_bytes for d in dones),
            "sent_bytes": sum(d.sent_bytes for d in dones),
        }
        self.iterations.append(entry)
        self.life.progress({"batch": step, "total": self.total, "loss": entry["loss"]})

    # -- messages -------------------------------------------------------------------------------

    def _on_done(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, AllreduceDone)
        if not self.life.ours(msg.run_id) or msg.device_id != item.sender:
            return
        if self.collective == "ps-async":
            self._async_done(msg)
            return
        if msg.step != self.step or msg.attempt != self.attempt or msg.device_id not in self.members:
            return
        self.done[msg.device_id] = msg
        if msg.weights is not None:
            if msg.weights.numel() != self.replica.size:
                self.central.discard(
                    item, f"weights of {msg.weights.numel()} floats, not {self.replica.size}"
                )
                return
            self.weights, self.weights_step = msg.weights, msg.step

    def _on_announce(self, item: Inbound) -> None:
        """A device of this run that restarted (idle again) is assigned again and joins at a later step."""
        msg = item.message
        assert isinstance(msg, Announce)
        d = msg.device_id
        if d in self.devices and msg.busy_with == "" and item.sender == d:
            if self.collective in ("ps-sync", "ps-async"):
                return
            if d not in self.ready:
                # Its assignment is outstanding: this is an answer to discovery sent before the assignment
                # came (taking it for a restart had every device excluded at step 0). A device restarted
                # after it was ready has lost the run: that is the case below.
                return
            if d in self.members:  # it restarted (with its id) before its death was noticed
                self.restarted.add(d)
            if d not in self.joiners:
                self.joiners.append(d)
            self.ready.discard(d)
            self._assign(d)
            log.info("%s is back: assigned again; it joins at a step boundary", d)

    def _on_error(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, ErrorReport)
        if self.life.ours(msg.run_id) and msg.code == "assign" and msg.device_id in self.devices:
            self.life.errors.append(f"{msg.device_id}: {msg.reason}")

    # -- the parameter server ---------------------------------------------------------------------

    def _reply(self, device: str, step: int, contributors: list[int]) -> None:
        central = self.central
        if self.failed.blocked(central.device_id, device, step):
            return
        central.send(
            central.topics.link(central.device_id, device),
            AllreduceMsg(
                run_id=central.run_id,
                step=step,
                attempt=self.attempt if self.collective == "ps-sync" else 0,
                kind="ps_weights",
                sender=0,
                contributors=contributors,
                data=self.replica.flat(),
                ts=time.monotonic(),
            ),
        )

    def _on_link(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, AllreduceMsg)
        if not self.life.ours(msg.run_id) or msg.kind != "ps_grad" or not isinstance(msg.data, torch.Tensor):
            return
        if item.sender not in self.members:  # a device outside the step must not move the model
            self.central.discard(item, f"{item.sender!r} is not a member of step {msg.step}")
            return
        if msg.data.numel() != self.replica.size:
            self.central.discard(item, f"a gradient of {msg.data.numel()} floats, not {self.replica.size}")
            return
        if self.collective == "ps-async":
            # One device's gradient is 1/n of a step's mean: a round of n gradients moves the model as far
            # as one synchronous step (at the full rate, 7 devices' stale gradients with momentum diverge).
            self.replica.apply(msg.data / len(self.members), self.train.batch_size)
            self.applied += 1
            self._reply(item.sender, msg.step, [msg.sender])
            return
        if msg.step != self.step or msg.attempt != self.attempt:
            return
        self.grads[item.sender] = msg.data
        if set(self.grads) >= set(self.members):
            total = torch.zeros(self.replica.size)
            for d in self.members:  # rank order
                total += self.grads[d]
            self.replica.apply(total / len(self.members), self.train.batch_size)
            ranks = list(range(len(self.members)))
            for d in self.members:
                self._reply(d, self.step, ranks)

    def _run_async(self, report: RunReport, first: int) -> None:
        """ps-async: every device trains on the server's latest model; ``total`` gradients per device (from
        step ``first``)."""
        central = self.central
        self.async_done = {d: first for d in self.members}
        self.step = first
        central.send(
            central.topics.fixed(Family.COMMIT),
            AllreduceStep(
                run_id=central.run_id,
                step=first,
                attempt=0,
                members=list(self.members),
                weights=self.replica.flat(),
            ),
        )
        epochs = -(-self.total // self.per_epoch)
        for epoch in range(first // self.per_epoch, epochs):
            goal = min(self.total, (epoch + 1) * self.per_epoch)

            def reached(goal: int = goal) -> bool:
                return all(self.async_done[d] >= goal for d in self.members)

            while not reached():
                dead = central.wait_until(
                    reached,
                    max(_STEP_FLOOR, self._deadline() * self.per_epoch),
                    f"ps-async: devices short of {goal} steps",
                    fault=lambda: [d for d in self.members if not self.life.live(d)] or None,
                )
                if dead:
                    self.members = [d for d in self.members if d not in dead]
                    self.life.event("allreduce-excluded", {"step": self.applied, "devices": dead})
                    if not self.members:
                        raise TrainingError("ps-async: no device left")
            self._end_epoch(report, goal - 1)

    def _async_done(self, msg: AllreduceDone) -> None:
        if msg.device_id not in self.members:
            return
        self.async_done[msg.device_id] = msg.step + 1
        self.durations.append(msg.collective_seconds + msg.compute_seconds)
        self.iterations.append(
            {
                "step": len(self.iterations),
                "attempt": 0,
                "epoch": len(self.iterations) // max(1, self.per_epoch * len(self.members)),
                "seconds": msg.collective_seconds + msg.compute_seconds,
                "collective_seconds": msg.collective_seconds,
                "compute_seconds": msg.compute_seconds,
                "loss": msg.loss,
                "samples": msg.samples,
                "members": [msg.device_id],
                "digests": {msg.device_id: msg.digest},
                "contributors": {msg.device_id: list(msg.contributors)},
                "failed_links": [],
                "dropped": msg.dropped,
            }
        )
        self.life.progress({"batch": self.applied, "total": self.total * len(self.devices), "loss": msg.loss})


__all__ = ["AllreduceRun"]
