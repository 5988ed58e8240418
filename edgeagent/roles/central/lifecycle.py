"""One run's lifecycle on the central node, as the training modes without a pipeline share it
(split-federated, allreduce): what a run does around its own training loop.

* **assigning** a device (:meth:`RunLifecycle.assign`: the ``Assign`` fields every mode fills alike) and
  the **ready barrier** (:meth:`RunLifecycle.await_ready`: every device built its part, or one said why it
  cannot);
* **liveness**, one rule (:meth:`RunLifecycle.live`): a device is gone when its last will came, or after
  :func:`~edgeagent.planner.deadlines.silence` of its own heartbeat interval (at least the central node's)
  plus the mode's ``slack``, the seconds its heartbeats may come late (the pipeline's rule, with its
  transfer slack);
* the run's **checkpoint** (its mode, id, settings and the report's history, with the mode's own state)
  and **resuming** from one (``--resume``, or a restarted central node);
* **events** on ``run/events`` (kept for the report), **progress**, the **report**'s common fields, and
  **saving the model** (``--save-model``).

A mode's run holds one :class:`RunLifecycle`; the node drives the run (``Central._drive``: attach,
execute, save the model) and owns its end (its ``stop``, the final figures, the node's status:
``Central._finish``), whatever the mode.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edgeagent.errors import TrainingError
from edgeagent.planner.deadlines import silence
from edgeagent.protocol.messages import Assign, Ready
from edgeagent.protocol.options import TrainOptions
from edgeagent.protocol.topics import Family
from edgeagent.roles.central.checkpoint_file import resume_of, save_model
from edgeagent.roles.central.report import RunReport
from edgeagent.runtime.intake import Inbound

if TYPE_CHECKING:
    from edgeagent.models import ModelSpec
    from edgeagent.roles.central.node import Central

log = logging.getLogger("edgeagent.roles.central")

# The report's history of a run, by epoch: a checkpoint carries it, a resumed run goes on with it.
HISTORY = ("test_accuracy_per_epoch", "test_loss_per_epoch", "train_loss_per_epoch")


class RunLifecycle:
    """The lifecycle of one run of ``mode`` over ``devices`` (the central node first; see the module doc).
    ``slack``: the seconds a device's heartbeats may come late on top of its missed intervals."""

    def __init__(
        self, central: Central, mode: str, spec: ModelSpec, devices: list[str], *, slack: float
    ) -> None:
        self.central = central
        self.mode = mode
        self.spec = spec
        self.config = central.config
        self.train = self.config.train
        self.options = TrainOptions.of(self.train)
        self.worker_list = devices
        self.devices = devices[1:]
        self.slack = slack
        self.ready: set[str] = set()  # devices that built their part (the ready barrier)
        self.errors: list[str] = []  # why a device could not take the run (the barrier fails)
        self.events: list[dict[str, Any]] = []  # the run's events so far (the report's, the checkpoint's)

    def ours(self, run_id: str) -> bool:
        return run_id == self.central.run_id

    # -- devices ----------------------------------------------------------------------------------

    def assign(
        self, device: str, *, worker_list: list[str], points: list[int], batches_per_epoch: int, **fields: Any
    ) -> None:
        """Send ``device`` its ``Assign``: the fields every mode fills alike, and the mode's ``fields``."""
        central, train = self.central, self.train
        central.send(
            central.topics.device(Family.CONTROL, device),
            Assign(
                run_id=central.run_id,
                plan_id=0,
                worker_list=worker_list,
                points=points,
                model=self.spec.to_dict(),
                seed=train.seed,
                committed_forward_id=-1,
                committed_backward_id=-1,
                status=0,
                options=self.options,
                epochs=train.epochs,
                batches_per_epoch=batches_per_epoch,
                in_flight=1,
                metrics_interval=self.config.metrics_interval,
                mode=self.mode,
                heartbeat_interval=self.config.heartbeat_interval,
                **fields,
            ),
        )

    def live(self, device: str) -> bool:
        """Whether ``device`` is alive: online (no last will since its last sign of life) and heard from
        within :func:`silence` of its own heartbeat interval, at least ours, plus ``slack``."""
        state = self.central.workers.get(device)
        if state is None or not state.online:
            return False
        limit = silence(state.heartbeat_interval, floor=self.config.heartbeat_interval, slack=self.slack)
        return time.monotonic() - state.last_heartbeat <= limit

    def revive(self, device: str) -> None:
        """An announcement of ``device`` is a sign of life (it restarted, and takes the run again)."""
        state = self.central.workers.get(device)
        if state is not None:
            state.online, state.last_heartbeat = True, time.monotonic()

    def on_ready(self, item: Inbound) -> None:
        """``Ready`` from a device of the run: it built its part."""
        msg = item.message
        assert isinstance(msg, Ready)
        if self.ours(msg.run_id) and msg.device_id == item.sender and msg.device_id in self.devices:
            self.ready.add(msg.device_id)

    def await_ready(self, what: str) -> None:
        """The ready barrier: every device of the run built its part (``what``, for the error if not)
        within the start-up timeout, or a :class:`TrainingError` says which did not, or why one cannot."""
        self.central.wait_until(
            lambda: self.ready >= set(self.devices) or bool(self.errors),
            self.config.startup_timeout,
            lambda: f"devices {sorted(set(self.devices) - self.ready)} did not {what}",
        )
        if self.errors:
            raise TrainingError(f"a device could not take the run: {self.errors[0]}")

    # -- the report -------------------------------------------------------------------------------

    def report(self, partition_mode: str) -> RunReport:
        """The report with the fields every run fills alike."""
        return RunReport(
            run_id=self.central.run_id,
            model=self.spec.name,
            dataset=self.train.dataset,
            workers=list(self.worker_list),
            learning_rate=self.train.learning_rate,
            mode=self.mode,
            partition_mode=partition_mode,
            estimator="none",
            compression=self.config.compression,
        )

    @staticmethod
    def conclude(report: RunReport, started: float, samples: int) -> None:
        """The report's time, final accuracy and throughput, once the run trained since ``started``
        (``time.perf_counter``) on ``samples`` samples."""
        report.train_seconds = time.perf_counter() - started
        report.final_accuracy = report.test_accuracy_per_epoch[-1] if report.test_accuracy_per_epoch else 0.0
        report.samples_per_second = samples / report.train_seconds if report.train_seconds else 0.0

    def event(self, name: str, details: dict[str, Any]) -> None:
        """Tell monitors (``run/events``); kept in ``events`` for the report and the checkpoint."""
        self.events.append({"name": name, **details})
        self.central.event(name, **details)

    def progress(self, values: dict[str, Any]) -> None:
        if self.central.progress is not None:
            self.central.progress(values)

    # -- checkpoints and the model ------------------------------------------------------------------

    def checkpoint(
        self, version: int, report: RunReport, what: str, state: Callable[[], dict[str, Any]]
    ) -> None:
        """The run's checkpoint of ``version`` (``--checkpoint``): its mode, id, settings and the report's
        history, with the mode's ``state()`` (taken only when checkpoints are on: it copies the model);
        written atomically."""
        central = self.central
        if not central.checkpointing:
            return
        common = {"mode": self.mode, "run_id": central.run_id, "config": self.config.model_dump_json()}
        history = {"history": {key: list(getattr(report, key)) for key in HISTORY}}
        central.save_checkpoint(version, common | state() | history, what)

    def resume(self, keys: tuple[str, ...]) -> dict[str, Any] | None:
        """The checkpoint this run resumes from (None: it starts afresh), checked to be of this mode and
        to hold ``keys`` (:func:`resume_of`)."""
        state = self.central.resume
        if state is None:
            return None
        resume_of(state, self.mode, keys)
        return state

    def resumed(self, report: RunReport, state: dict[str, Any], where: str, **recovery: Any) -> None:
        """The run goes on from ``state`` (``where``: after which epoch or at which step, for the log):
        the report takes its history and says it recovered (``recovery``: where from)."""
        for key in HISTORY:
            getattr(report, key).extend(state["history"][key])
        report.recoveries.append({"case": "central", **recovery})
        log.info("resuming run %s %s", self.central.run_id, where)

    def save_model(self, path: str, weights: dict[str, Any]) -> bool:
        """``--save-model``: the trained global model, with what it is (model, run, training settings)."""
        run_id = self.central.run_id
        return save_model(path, weights, "the global model", spec=self.spec, run_id=run_id, train=self.train)


__all__ = ["HISTORY", "RunLifecycle"]
