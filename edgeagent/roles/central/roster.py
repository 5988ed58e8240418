"""The devices the central node knows (papers/000 Sec. III-B): what they announced, the heartbeat interval
each says it beats at, the run's workers with their liveness (stamped on the network thread as messages
arrive), and the discovery that picks the run's workers.

Liveness must not depend on how busy the central node's own thread is: a heartbeat that waits in the queue
behind a long computation would make a healthy device look dead, so :meth:`Roster.stamp` runs on the
network thread (``Role.on_arrival``). The maps of what devices announced are bounded (1024 devices): forged
ids must not grow them forever, and the run's own devices are never forgotten.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from edgeagent.config import CHARACTERISE_ROUNDS, CentralConfig
from edgeagent.models import ModelSpec
from edgeagent.predictor.measure import (
    ModelLayers,
    characterise_bound,
    characterise_ranges,
    model_key,
    time_range,
)
from edgeagent.predictor.store import shipped_path
from edgeagent.protocol.messages import Announce, Discover, Heartbeat, Message, Status
from edgeagent.protocol.topics import Family, Topics
from edgeagent.runtime.intake import Inbound

log = logging.getLogger("edgeagent.roles.central")
_MAX_ANNOUNCED = 1024  # devices remembered from their announcements (the run's own are never dropped)


@dataclass
class DeviceState:
    """What the central node knows of one worker: liveness (stamped on the network thread) and what it
    announced (emulated slowdown, memory limit)."""

    device_id: str
    last_heartbeat: float
    slowdown: float = 1.0
    memory_limit: float = 0.0
    online: bool = True
    heartbeat_interval: float = 0.0  # the device's own, as its heartbeats say (0: none seen yet)


class RosterOwner(Protocol):
    """What discovery needs of the central node: its settings, names, and the role's messaging."""

    config: CentralConfig
    run_id: str
    device_id: str
    topics: Topics

    def send(self, topic: str, message: Message, *, retain: bool = False, qos: int = 1) -> int: ...

    def on(self, kind: type[Announce], handler: Callable[[Inbound], None]) -> None: ...

    def wait_until(
        self, done: Callable[[], bool], timeout: float, what: str | Callable[[], str]
    ) -> object | None: ...


class Roster:
    """The central node's devices (see the module doc); ``workers`` are the run's, once discovered."""

    def __init__(self, owner: RosterOwner) -> None:
        self.owner = owner
        self.workers: dict[str, DeviceState] = {}  # the run's devices; liveness stamped on arrival
        self.announced: dict[str, Announce] = {}  # what devices announced (joins, restarts)
        # Every device's own heartbeat interval, as its heartbeats say (liveness waits for its own, not
        # ours: a device profile may set up to 60 s); bounded like the announcements.
        self.heartbeat_intervals: dict[str, float] = {}
        self._own_h_seconds: float | None = None  # at most what measuring h here takes (the h wait's unit)

    # -- liveness, on the network thread ----------------------------------------------------------

    def stamp(self, sender: str, message: Message, run_id: str) -> None:
        """Network thread: liveness is stamped on arrival. Any message from a worker is a sign of life,
        not only heartbeats: on a saturated slow uplink its heartbeats wait behind the activations in the
        same TCP stream."""
        if isinstance(message, Heartbeat) and message.device_id == sender:
            self._note_interval(sender, message.interval)
        w = self.workers.get(sender)
        # Its last will (``offline``) or its clean exit (``left``, a stopped service): gone either way.
        if isinstance(message, Status) and message.state in ("offline", "left"):
            if w is not None:
                w.online = False
            return
        if w is not None and (isinstance(message, Heartbeat) or getattr(message, "run_id", None) == run_id):
            w.last_heartbeat = time.monotonic()
            w.online = True

    def _note_interval(self, device: str, interval: float) -> None:
        """Network thread: ``device`` beats every ``interval`` seconds (a profile may change it)."""
        intervals = self.heartbeat_intervals
        if device not in intervals and len(intervals) >= _MAX_ANNOUNCED:
            keep = set(self.workers)
            oldest = next((d for d in intervals if d not in keep), None)
            if oldest is None:
                return
            del intervals[oldest]
        intervals[device] = interval
        w = self.workers.get(device)
        if w is not None:
            w.heartbeat_interval = interval

    def remember(self, msg: Announce, *, keep: list[str]) -> None:
        """Keep ``msg`` as the device's latest announcement; bounded (forged ids must not grow it forever),
        never forgetting the devices in ``keep``."""
        self.announced.pop(msg.device_id, None)
        self.announced[msg.device_id] = msg
        while len(self.announced) > _MAX_ANNOUNCED:
            oldest = next(d for d in self.announced if d not in keep)
            del self.announced[oldest]

    # -- discovery --------------------------------------------------------------------------------

    def discover(self, wanted: int, spec: ModelSpec) -> list[str]:
        """Ask devices to announce themselves until ``wanted`` idle workers answered. With the latency
        predictor the request names the model and batch size, and every worker answers with its ``h``
        (papers/004 Sec. 3.2): the wait for those is bounded (see :meth:`h_wait`); a device whose ``h``
        did not come is planned by FTPipeHD's capacity estimate."""
        if wanted == 0:
            return []
        owner = self.owner
        found: dict[str, Announce] = {}
        request = self._h_request(spec)
        key = model_key(spec)

        def has_h(msg: Announce) -> bool:
            return msg.h_key == key and msg.h_batch == owner.config.train.batch_size and len(msg.h) > 0

        def on_announce(item: Inbound) -> None:
            msg = item.message
            assert isinstance(msg, Announce)
            # Idle devices, or (after the central node itself restarted) devices still in this run.
            if msg.busy_with in ("", owner.run_id) and msg.device_id != owner.device_id:
                old = found.get(msg.device_id)
                if old is None or has_h(msg) or not has_h(old):
                    found[msg.device_id] = msg

        next_ask = 0.0
        h_deadline: float | None = None

        def enough() -> bool:
            nonlocal next_ask, h_deadline
            now = time.monotonic()
            if len(found) >= wanted:
                if request is None or all(has_h(found[d]) for d in sorted(found)[:wanted]):
                    return True
                if h_deadline is None:
                    h_deadline = now + self.h_wait(spec)
                    log.info("waiting up to %.0f s for the workers' h", h_deadline - now)
                elif now >= h_deadline:
                    return True
            if now >= next_ask:
                model, batch = request if request is not None else ({}, 0)
                owner.send(
                    owner.topics.fixed(Family.DISCOVER),
                    Discover(run_id=owner.run_id, model=model, batch_size=batch),
                )
                next_ask = now + 2.0
            return False

        log.info("waiting for %d worker(s) on %s", wanted, owner.topics.base)
        owner.on(Announce, on_announce)
        owner.wait_until(
            enough,
            owner.config.startup_timeout + (self.h_wait(spec) if request is not None else 0.0),
            lambda: (
                f"only {len(found)} of {wanted} workers announced themselves ({sorted(found)}); start "
                f"more with `edgeagent worker --broker URL --cluster {owner.topics.cluster}`"
            ),
        )
        # The worker list is ordered by device id so that a re-run gives the same pipeline.
        chosen = sorted(found)[:wanted]
        now = time.monotonic()
        for d in chosen:
            self.workers[d] = DeviceState(
                d,
                now,
                slowdown=found[d].slowdown,
                memory_limit=found[d].memory_limit,
                heartbeat_interval=self.heartbeat_intervals.get(d, 0.0),
            )
            self.remember(found[d], keep=chosen)
        log.info("workers: %s", ", ".join(chosen))
        return chosen

    def _h_request(self, spec: ModelSpec) -> tuple[dict[str, Any], int] | None:
        """The model and batch size the workers measure ``h`` for, when the run uses the predictor."""
        config = self.owner.config
        if (
            config.estimator != "predictor"
            or config.partition != "dynamic"
            or not shipped_path(spec).exists()
        ):
            return None
        return spec.to_dict(), config.train.batch_size

    def h_wait(self, spec: ModelSpec) -> float:
        """How long to wait for the workers' ``h`` once they answered: 60 times what measuring it would take
        on the central node (a Pi is 10-50x slower), at least 20 s. That time is bounded from one
        forward+backward of the whole model (:func:`characterise_bound`), once per run: measuring ``h``
        here would hold up the discovery for as long as the workers take to measure theirs."""
        if self._own_h_seconds is None:
            config = self.owner.config
            model = ModelLayers.build(spec, config.train.batch_size)
            step = time_range(model, 0, model.num_layers, reps=1, slowdown=config.slowdown, min_seconds=0)
            ranges = sum(map(len, characterise_ranges(model)))
            self._own_h_seconds = characterise_bound(step, ranges, rounds=CHARACTERISE_ROUNDS)
        return max(20.0, 60.0 * self._own_h_seconds)


__all__ = ["DeviceState", "Roster", "RosterOwner"]
