"""The central node: holds the data, runs stage 0, drives the pipeline and evaluates.

Initialization follows papers/000 Sec. III-B: discover workers, form the ordered worker list, profile
the layers, make the initial (equal-device) partition, send every worker the Table I state and wait
until all have built their stages. Training follows Sec. III-C: 1F1B with a bound on the batches in
flight, weight stashing and vertical sync (the version travels with each batch).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from edgeagent.config import CentralConfig
from edgeagent.data import Dataset, batch_indices, batches_per_epoch, load_dataset
from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec, build_model, num_layers
from edgeagent.pipeline.schedule import admit
from edgeagent.pipeline.stage import Stage, StageModule, StageOptions
from edgeagent.planner.partition import balanced_partition
from edgeagent.planner.profiler import LayerProfile, profile_layers
from edgeagent.protocol.messages import (
    Activation,
    Announce,
    Assign,
    Command,
    Discover,
    ErrorReport,
    EvalResult,
    Event,
    Gradient,
    Heartbeat,
    Ready,
    Status,
    Weights,
)
from edgeagent.protocol.topics import Family, Topics
from edgeagent.roles.base import Clock, Inbound, Role, configure_threads, emulate_slowdown
from edgeagent.transport.base import Transport
from edgeagent.transport.mqtt import MqttTransport

log = logging.getLogger(__name__)

ProgressHook = Callable[[dict[str, Any]], None]


@dataclass
class RunReport:
    """What ``--report`` writes (JSON)."""

    run_id: str
    model: str
    dataset: str
    workers: list[str]
    final_accuracy: float = 0.0
    test_accuracy_per_epoch: list[float] = field(default_factory=list)
    test_loss_per_epoch: list[float] = field(default_factory=list)
    train_loss_per_epoch: list[float] = field(default_factory=list)
    samples_per_second: float = 0.0
    batches: int = 0
    epochs: int = 0
    wall_seconds: float = 0.0
    train_seconds: float = 0.0
    partitions: list[dict[str, Any]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    aggregation: bool = True
    layer_profile: dict[str, Any] = field(default_factory=dict)
    timeline: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class _Worker:
    device_id: str
    last_heartbeat: float
    online: bool = True


class Central(Role):
    """Runs one training run to its end: ``Central(config).run()`` returns the :class:`RunReport`."""

    def __init__(
        self, config: CentralConfig, transport: Transport | None = None, progress: ProgressHook | None = None
    ) -> None:
        topics = Topics(config.cluster)
        self._owns_transport = transport is None
        if transport is None:
            will = Role.offline_will_for(topics, config.device_id)
            transport = MqttTransport(config.broker, f"ea-{config.cluster}-{config.device_id}", will=will)
        super().__init__(transport, topics, config.device_id)
        self.config = config
        self.train = config.train
        self.run_id = uuid.uuid4().hex[:12]
        self.plan_id = 0
        self.progress = progress
        self.workers: dict[str, _Worker] = {}
        self.worker_list: list[str] = []
        self.points: list[int] = []
        self._ready: set[str] = set()
        self._gradients: dict[int, Gradient] = {}
        self._results: dict[int, EvalResult] = {}
        self._weights: dict[str, Weights] = {}
        self._sent_at: dict[int, float] = {}

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> RunReport:
        started = time.perf_counter()
        configure_threads(self.config.threads)
        torch.manual_seed(self.train.seed)
        for family in (Family.ANNOUNCE,):
            self.listen(self.topics.fixed(family))
        for family in (Family.HEARTBEAT, Family.STATUS, Family.REPLY):
            self.listen(self.topics.devices(family))
        if not self.transport.wait_connected(self.config.startup_timeout):
            raise TrainingError(
                f"no broker at {getattr(self.transport, 'url', '?')} after "
                f"{self.config.startup_timeout:.0f} s; start one or pass --broker"
            )
        self.set_status("training", run_id=self.run_id, stage=0)
        self.start_heartbeats(self.config.heartbeat_interval)
        try:
            data = load_dataset(
                self.train.dataset, seed=self.train.seed, test_fraction=self.train.test_fraction
            )
            spec = ModelSpec(
                self.train.model,
                data.in_shape,
                data.num_classes,
                tuple(sorted(self.train.model_options.items())),
            )
            self.worker_list = [self.device_id, *self._discover(self.config.workers)]
            profile = self._profile(spec, data)
            n_stages = len(self.worker_list)
            self.points = balanced_partition(profile.seconds, n_stages)
            stage = self._setup(spec)
            report = RunReport(
                run_id=self.run_id,
                model=self.train.model,
                dataset=data.name,
                workers=self.worker_list[1:],
                in_flight=self._bound(),
                aggregation=self.train.aggregation,
                layer_profile=profile.to_dict(),
            )
            report.partitions.append(
                {"batch": 0, "points": list(self.points), "reason": "initial (equal devices)"}
            )
            self._event("partition", points=self.points, batch=0)
            self._train(stage, data, report)
            report.wall_seconds = time.perf_counter() - started
            if self.config.save_model:
                self._save_model(stage, spec)
            return report
        finally:
            self._finish()

    def _finish(self) -> None:
        if self.worker_list[1:]:
            self.send(self.topics.fixed(Family.COMMAND), Command(run_id=self.run_id, name="stop"))
        self.set_status("idle")
        self.stop_heartbeats()
        if self._owns_transport:
            self.transport.close()

    def _bound(self) -> int:
        return self.train.in_flight or len(self.worker_list)

    def _event(self, name: str, **details: Any) -> None:
        self.send(self.topics.fixed(Family.EVENTS), Event(name=name, run_id=self.run_id, details=details))

    # -- initialization (Sec. III-B) -----------------------------------------------------------

    def _discover(self, wanted: int) -> list[str]:
        """Ask devices to announce themselves until ``wanted`` idle workers answered."""
        if wanted == 0:
            return []
        found: dict[str, Announce] = {}
        deadline = time.monotonic() + self.config.startup_timeout
        next_ask = 0.0
        log.info("waiting for %d worker(s) on %s", wanted, self.topics.base)
        while len(found) < wanted:
            now = time.monotonic()
            if now > deadline:
                raise TrainingError(
                    f"only {len(found)} of {wanted} workers announced themselves within "
                    f"{self.config.startup_timeout:.0f} s ({sorted(found)}); start more with "
                    f"`edgeagent worker --broker URL --cluster {self.topics.cluster}`"
                )
            if now >= next_ask:
                self.send(self.topics.fixed(Family.DISCOVER), Discover(run_id=self.run_id))
                next_ask = now + 2.0
            item = self.next_message(0.2)
            if item is None:
                continue
            msg = item.message
            if isinstance(msg, Announce) and not msg.busy_with and msg.device_id != self.device_id:
                found.setdefault(msg.device_id, msg)
        # The worker list is ordered by device id so that a re-run gives the same pipeline.
        chosen = sorted(found)[:wanted]
        now = time.monotonic()
        self.workers = {d: _Worker(d, now) for d in chosen}
        log.info("workers: %s", ", ".join(chosen))
        return chosen

    def _profile(self, spec: ModelSpec, data: Dataset) -> LayerProfile:
        model = build_model(spec, seed=self.train.seed)
        sample = data.x_train[: self.train.batch_size]
        profile = profile_layers(list(model), sample, runs=10)
        log.info(
            "profiled %d layers: %.2f ms per batch in all", len(profile.seconds), 1e3 * sum(profile.seconds)
        )
        return profile

    def _setup(self, spec: ModelSpec) -> Stage:
        n_stages = len(self.worker_list)
        initial = self._initial_weights()
        for index, device in enumerate(self.worker_list[1:], start=1):
            start, end = self.points[index], self.points[index + 1]
            weights = None
            if initial is not None:
                weights = {k: v for k, v in initial.items() if start <= int(k.split(".")[1]) < end}
            self.send(
                self.topics.device(Family.CONTROL, device),
                Assign(
                    run_id=self.run_id,
                    plan_id=self.plan_id,
                    worker_list=self.worker_list,
                    points=self.points,
                    model=spec.to_dict(),
                    seed=self.train.seed,
                    committed_forward_id=-1,
                    committed_backward_id=-1,
                    status=0,
                    learning_rate=self.train.learning_rate,
                    epochs=self.train.epochs,
                    batches_per_epoch=0,
                    momentum=self.train.momentum,
                    weight_decay=self.train.weight_decay,
                    in_flight=self._bound(),
                    aggregation=self.train.aggregation,
                    aggregation_interval=self.train.aggregation_interval,
                    weights=weights,
                ),
            )
        from edgeagent.models import build_layers

        layers = build_layers(spec, 0, self.points[1], seed=self.train.seed)
        module = StageModule(dict(enumerate(layers)))
        if initial is not None:
            module.load_state_dict(
                {k: v for k, v in initial.items() if int(k.split(".")[1]) < self.points[1]}
            )
        stage = Stage(
            module,
            StageOptions(
                learning_rate=self.train.learning_rate,
                momentum=self.train.momentum,
                weight_decay=self.train.weight_decay,
                aggregation=self.train.aggregation,
                aggregation_window=n_stages,
                aggregation_interval=self.train.aggregation_interval,
            ),
            is_first=True,
            is_last=n_stages == 1,
        )
        self.listen(self.topics.gradients(1)) if n_stages > 1 else None
        self.listen(self.topics.results(n_stages - 1)) if n_stages > 1 else None
        self._wait_ready()
        return stage

    def _initial_weights(self) -> dict[str, torch.Tensor] | None:
        """Pre-trained weights (continuous learning), renamed to the stage modules' ``layers.<j>.`` keys."""
        if not self.train.init_weights:
            return None
        state = torch.load(self.train.init_weights, map_location="cpu", weights_only=True)
        return {k if k.startswith("layers.") else f"layers.{k}": v for k, v in state.items()}

    def _wait_ready(self) -> None:
        pending = set(self.worker_list[1:])
        deadline = time.monotonic() + self.config.startup_timeout
        while pending:
            if time.monotonic() > deadline:
                raise TrainingError(
                    f"workers {sorted(pending)} did not build their stages within "
                    f"{self.config.startup_timeout:.0f} s"
                )
            item = self.next_message(0.2)
            if item is None:
                continue
            msg = item.message
            if isinstance(msg, Ready) and msg.run_id == self.run_id and msg.plan_id == self.plan_id:
                pending.discard(msg.device_id)
            elif isinstance(msg, ErrorReport) and msg.run_id == self.run_id:
                raise TrainingError(f"worker {msg.device_id} refused its stage: {msg.reason}")
            else:
                self._handle_background(item)

    # -- training (Sec. III-C) -----------------------------------------------------------------

    def _train(self, stage: Stage, data: Dataset, report: RunReport) -> None:
        n_train = data.x_train.shape[0]
        per_epoch = batches_per_epoch(n_train, self.train.batch_size)
        total = per_epoch * self.train.epochs
        if self.train.max_batches:
            total = min(total, self.train.max_batches)
        bound = self._bound()
        train_started = time.perf_counter()
        self.times.reset()
        samples = 0
        next_f = 0  # next global batch id to forward
        committed_b = -1  # committed backward id (Table I)
        losses: list[float] = []
        epoch_orders: dict[int, list[torch.Tensor]] = {}

        def batch(global_id: int) -> tuple[torch.Tensor, torch.Tensor]:
            epoch, i = divmod(global_id, per_epoch)
            if epoch not in epoch_orders:
                epoch_orders.clear()
                epoch_orders[epoch] = batch_indices(
                    n_train, self.train.batch_size, epoch=epoch, seed=self.train.seed
                )
            idx = epoch_orders[epoch][i]
            return data.x_train[idx], data.y_train[idx]

        eval_seconds = 0.0
        while committed_b + 1 < total:
            epoch_end = min(total, (committed_b + 1) // per_epoch * per_epoch + per_epoch)
            in_flight = next_f - committed_b - 1
            grad = self._gradients.pop(committed_b + 1, None)
            if grad is not None or (stage.is_last and in_flight > 0):
                # Backward of the oldest batch in flight.
                bid = committed_b + 1
                started = Clock()
                if stage.is_last:
                    x, y = batch(bid)
                    result = stage.backward(bid, labels=y)
                    loss, correct = result.loss, result.correct
                else:
                    assert grad is not None
                    stage.backward(bid, grad_output=grad.g)
                    loss, correct = grad.loss, grad.correct
                emulate_slowdown(started, self.config.slowdown, self.times)
                committed_b = bid
                self._sent_at.pop(bid, None)
                losses.append(loss)
                samples += self.train.batch_size
                elapsed = time.perf_counter() - train_started - eval_seconds
                report.timeline.append({"batch": bid, "t": round(elapsed, 4), "loss": loss})
                self._notify(batch=bid + 1, total=total, loss=loss, correct=correct)
                if committed_b + 1 == epoch_end:
                    epoch = committed_b // per_epoch
                    eval_started = time.perf_counter()
                    acc, test_loss = self._evaluate(stage, data)
                    eval_seconds += time.perf_counter() - eval_started
                    report.test_accuracy_per_epoch.append(acc)
                    report.test_loss_per_epoch.append(test_loss)
                    tail = losses[-per_epoch:]
                    report.train_loss_per_epoch.append(sum(tail) / max(1, len(tail)))
                    log.info("epoch %d: test accuracy %.2f%%, test loss %.4f", epoch, 100 * acc, test_loss)
                    self._event("epoch", epoch=epoch, accuracy=acc, loss=test_loss, batch=committed_b)
                    self._notify(epoch=epoch, accuracy=acc)
                continue
            if next_f < epoch_end and admit(in_flight, bound):
                started = Clock()
                x, y = batch(next_f)
                out, version = stage.forward(next_f, x)
                emulate_slowdown(started, self.config.slowdown, self.times)
                if not stage.is_last:
                    self.send(
                        self.topics.activations(0),
                        Activation(
                            run_id=self.run_id,
                            plan_id=self.plan_id,
                            stage=0,
                            batch_id=next_f,
                            version=version,
                            mode="train",
                            x=out,
                            y=y,
                        ),
                    )
                    self._sent_at[next_f] = time.monotonic()
                next_f += 1
                continue
            self._wait_for_messages()
        report.train_seconds = time.perf_counter() - train_started - eval_seconds
        t = self.times.summary()
        log.info(
            "central: of %.1f s: compute %.1f, communication %.1f, idle %.1f",
            t["wall"],
            t["compute"],
            t["communication"],
            t["idle"],
        )
        report.batches = committed_b + 1
        report.epochs = len(report.test_accuracy_per_epoch)
        report.samples_per_second = samples / report.train_seconds if report.train_seconds else 0.0
        if report.test_accuracy_per_epoch:
            report.final_accuracy = report.test_accuracy_per_epoch[-1]
        elif total:
            report.final_accuracy, _ = self._evaluate(stage, data)

    def _wait_for_messages(self) -> None:
        """Block for the next message; meanwhile check that the pipeline is alive."""
        item = self.next_message(0.5)
        if item is not None:
            self._handle_background(item)
        self._check_liveness()

    def _check_liveness(self) -> None:
        now = time.monotonic()
        for bid, sent in self._sent_at.items():
            if now - sent > self.config.batch_timeout:
                raise TrainingError(
                    f"gradients of batch {bid} did not come back within {self.config.batch_timeout:.0f} s; "
                    f"check the workers {self.worker_list[1:]} (logs, `edgeagent monitor`)"
                )
            break  # the oldest batch is enough
        limit = 5 * self.config.heartbeat_interval
        for w in self.workers.values():
            if w.online and now - w.last_heartbeat > limit:
                w.online = False
                log.warning("worker %s missed heartbeats for %.1f s", w.device_id, now - w.last_heartbeat)
        dead = [w.device_id for w in self.workers.values() if not w.online]
        if dead and self._sent_at:
            raise TrainingError(
                f"worker(s) {dead} stopped (no heartbeat or offline status) with batches in flight; "
                "this run cannot continue without them"
            )

    def _handle_background(self, item: Inbound) -> None:
        msg = item.message
        if isinstance(msg, Gradient):
            if msg.run_id == self.run_id and msg.plan_id == self.plan_id:
                self._gradients[msg.batch_id] = msg
        elif isinstance(msg, EvalResult):
            if msg.run_id == self.run_id and msg.plan_id == self.plan_id:
                self._results[msg.batch_id] = msg
        elif isinstance(msg, Heartbeat):
            w = self.workers.get(msg.device_id)
            if w is not None:
                w.last_heartbeat = time.monotonic()
                w.online = True
        elif isinstance(msg, Status):
            w = self.workers.get(msg.device_id)
            if w is not None and msg.state == "offline":
                w.online = False
                log.warning("worker %s went offline (last will)", msg.device_id)
        elif isinstance(msg, Weights):
            if msg.run_id == self.run_id:
                self._weights[msg.device_id] = msg
        elif isinstance(msg, ErrorReport):
            log.error("worker %s reports %s: %s", msg.device_id, msg.code, msg.reason)

    def _notify(self, **values: Any) -> None:
        if self.progress is not None:
            self.progress(values)

    # -- evaluation ----------------------------------------------------------------------------

    def _evaluate(self, stage: Stage, data: Dataset) -> tuple[float, float]:
        """Test accuracy with the newest weights, pushed through the pipeline in eval mode."""
        bs = self.train.eval_batch_size
        n = data.x_test.shape[0]
        chunks = [(i, data.x_test[i : i + bs], data.y_test[i : i + bs]) for i in range(0, n, bs)]
        correct = 0
        loss_sum = 0.0
        if stage.is_last:
            for _, x, y in chunks:
                out = stage.evaluate(x)
                correct += int((out.argmax(dim=1) == y).sum())
                loss_sum += float(torch.nn.functional.cross_entropy(out, y, reduction="sum"))
            return correct / max(1, n), loss_sum / max(1, n)
        self._results.clear()
        deadline = time.monotonic() + self.config.batch_timeout
        for eid, x, y in chunks:
            started = Clock()
            out = stage.evaluate(x)
            emulate_slowdown(started, self.config.slowdown, self.times)
            self.send(
                self.topics.activations(0),
                Activation(
                    run_id=self.run_id,
                    plan_id=self.plan_id,
                    stage=0,
                    batch_id=eid,
                    version=0,
                    mode="eval",
                    x=out,
                    y=y,
                ),
            )
        while len(self._results) < len(chunks):
            if time.monotonic() > deadline:
                raise TrainingError(
                    f"evaluation got {len(self._results)} of {len(chunks)} results within "
                    f"{self.config.batch_timeout:.0f} s"
                )
            self._wait_for_messages()
        for r in self._results.values():
            correct += r.correct
            loss_sum += r.loss_sum
        return correct / max(1, n), loss_sum / max(1, n)

    # -- the trained model ---------------------------------------------------------------------

    def collect_weights(self, stage: Stage) -> dict[str, torch.Tensor]:
        """The whole model's state, gathered from every stage (keys ``<layer>.<name>``)."""
        self._weights.clear()
        if len(self.worker_list) > 1:
            self.send(self.topics.fixed(Family.COMMAND), Command(run_id=self.run_id, name="collect"))
        deadline = time.monotonic() + self.config.startup_timeout
        while len(self._weights) < len(self.worker_list) - 1:
            if time.monotonic() > deadline:
                missing = sorted(set(self.worker_list[1:]) - set(self._weights))
                raise TrainingError(f"workers {missing} did not send their weights")
            item = self.next_message(0.2)
            if item is not None:
                self._handle_background(item)
        state: dict[str, torch.Tensor] = {}
        for part in [stage.state(), *(w.tensors for w in self._weights.values())]:
            for key, value in part.items():
                state[key.removeprefix("layers.")] = value
        return state

    def _save_model(self, stage: Stage, spec: ModelSpec) -> None:
        path = self.config.save_model
        assert path is not None
        state = self.collect_weights(stage)
        expected = num_layers(spec)
        torch.save(state, path)
        log.info("saved the trained model (%d layers, %d tensors) to %s", expected, len(state), path)
