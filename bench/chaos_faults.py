"""The chaos benchmark's faults (``bench/chaos.py``): the seeded schedule (pure), the injections, and whether
the run survived each.

A fault fires once the run has committed its batch ``at`` and a further ``lag`` batches' time has gone by
(so it lands anywhere: mid-batch, in an evaluation, during a checkpoint or a re-split), and only after the
previous fault was survived: each recovery is finished before the next fault, as the issue asks.

**Survived.** At the fault the run had committed batch ``b`` and at most ``K`` batches (one per stage)
were in flight; batch ``b + K + 1`` had not been started. The fault is survived when the run commits that
batch within the window: training went on past the fault, whatever recovery it took (a rollback
replays batches up to ``b`` first). ``back`` is the time from the fault to that commit. The window is
derived from the run's settings and its measured pace (:meth:`Chaos.window`): the fault's own duration,
the central node's measured start-up, ``RestartSec``, the restart window and the batch timer's floor
(the longest a recovery may wait by design), and the replay of a replication interval with the pipeline
refilled, at four times the measured seconds per batch (the central node's timeout multiplier).
"""

from __future__ import annotations

import enum
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bench.chaos_lab import FORGER, Broker, Network, Service, Site, Workload, say
from bench.chaos_watch import Observer, Progress
from edgeagent.protocol.messages import Announce, Event
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import encode
from edgeagent.transport.mqtt import BrokerUrl, MqttTransport, TlsOptions

GHOST = "a-ghost"  # the id a forged announce invents


class Kind(enum.Enum):
    WORKER_SIGKILL = "worker-sigkill"
    WORKER_SIGSTOP = "worker-sigstop"
    CENTRAL_SIGTERM = "central-sigterm"
    CENTRAL_SIGKILL = "central-sigkill"
    BROKER_RESTART = "broker-restart"
    LINK_DOWN = "link-down"
    NAN = "nan-gradient"
    FORGED_ANNOUNCE = "forged-announce"


# Seconds each kind lasts, drawn uniformly: until a SIGKILLed worker is started again (beyond the central
# node's 30 s restart window it is left out and joins later), a worker stopped, a link down (beyond the
# client's keepalive, 15 s, the broker drops the connection), the broker down.
DURATIONS: dict[Kind, tuple[float, float]] = {
    Kind.WORKER_SIGKILL: (2.0, 40.0),
    Kind.WORKER_SIGSTOP: (1.0, 30.0),
    Kind.LINK_DOWN: (1.0, 30.0),
    Kind.BROKER_RESTART: (0.5, 10.0),
}
LAG = (0.0, 3.0)  # batches' time between the fault's batch and the fault


@dataclass(frozen=True)
class Fault:
    index: int
    at: int  # fires once the run has committed this batch...
    lag: float  # ...and this many batches' time later
    kind: Kind
    target: str  # a worker, "central" or "broker"; a forged announce: the device it impersonates
    seconds: float = 0.0  # see DURATIONS; a central SIGKILL: the unit's RestartSec

    def describe(self) -> str:
        what = {
            Kind.WORKER_SIGKILL: f"SIGKILL, started again after {self.seconds:.1f} s",
            Kind.WORKER_SIGSTOP: f"SIGSTOP for {self.seconds:.1f} s, then SIGCONT",
            Kind.CENTRAL_SIGTERM: "SIGTERM, then the unit's command again (systemctl restart)",
            Kind.CENTRAL_SIGKILL: f"SIGKILL, the unit's command again after RestartSec={self.seconds:g}",
            Kind.BROKER_RESTART: f"stopped, started again on its port after {self.seconds:.1f} s",
            Kind.LINK_DOWN: f"link down for {self.seconds:.1f} s",
            Kind.NAN: "NaN in its next gradient (SIGUSR1)",
            Kind.FORGED_ANNOUNCE: f"announces for {GHOST!r} and for {self.target!r} from {FORGER!r}",
        }[self.kind]
        return f"{self.kind.value} {self.target}: {what}"


def make_schedule(
    seed: int,
    kinds: list[Kind],
    *,
    per_kind: int,
    first: int,
    last: int,
    workers: list[str],
    restart_sec: float,
) -> list[Fault]:
    """``per_kind`` faults of each kind in a seeded order, one in each of as many equal slots of batches
    ``[first, last]`` (at a seeded batch of its slot), targets and durations seeded too. Pure: the same
    arguments give the same schedule."""
    rng = random.Random(seed)
    pool = [k for k in kinds for _ in range(per_kind)]
    rng.shuffle(pool)
    width = (last - first) / max(1, len(pool))
    faults = []
    for i, kind in enumerate(pool):
        at = first + int(i * width + rng.uniform(0, width))
        lag = rng.uniform(*LAG)
        if kind in (Kind.CENTRAL_SIGTERM, Kind.CENTRAL_SIGKILL):
            target = "central"
        elif kind is Kind.BROKER_RESTART:
            target = "broker"
        else:
            target = rng.choice(workers)
        low_high = DURATIONS.get(kind)
        seconds = round(rng.uniform(*low_high), 1) if low_high else 0.0
        if kind is Kind.CENTRAL_SIGKILL:
            seconds = restart_sec
        faults.append(Fault(i + 1, at, round(lag, 2), kind, target, seconds))
    return faults


@dataclass
class Outcome:
    """What became of one fault."""

    fault: Fault
    t: float  # when it was injected (time.monotonic())
    batch: int  # the highest batch committed then
    target: str  # who was hit (a NaN goes to a worker of the run)
    window: float
    back: float | None = None  # seconds until the run committed a batch it had not started at the fault
    events: list[tuple[float, Event]] = field(default_factory=list)  # the cluster's events meanwhile
    problems: list[str] = field(default_factory=list)  # what should not have happened
    notes: list[str] = field(default_factory=list)  # more of what the cluster did (from its logs)

    @property
    def survived(self) -> bool:
        return self.back is not None and self.back <= self.window and not self.problems

    def summary(self) -> str:
        """What the cluster did about it, from its events."""
        parts = []
        for _, e in self.events:
            d = e.details
            if e.name == "fault":
                parts.append(f"fault at {d.get('batch')}")
            elif e.name == "recovery":
                parts.append(f"recovery case {d.get('case')} to {d.get('rolled_back_to')}")
            elif e.name == "run-suspended":
                parts.append(f"suspended at v{d.get('version')}")
            elif e.name == "run-resumed":
                parts.append(f"resumed from v{d.get('version')}")
            elif e.name == "join":
                parts.append(f"{d.get('device')} joined")
        return ", ".join([*_squeeze(parts), *self.notes]) or "no recovery needed"


def _squeeze(parts: list[str]) -> list[str]:
    """Repeated neighbours once, with a count: "fault at 120 (x2)"."""
    out: list[str] = []
    for p in parts:
        if out and out[-1].split(" (x")[0] == p:
            n = int(out[-1].split(" (x")[1][:-1]) + 1 if " (x" in out[-1] else 2
            out[-1] = f"{p} (x{n})"
        else:
            out.append(p)
    return out


class Forger:
    """An authenticated device (its own login and certificate) that tries to announce as others."""

    def __init__(self, url: str, cluster: str, site: Site) -> None:
        self.topics = Topics(cluster)
        ca, cert, key = site.files(FORGER)
        login = replace(BrokerUrl.parse(url), username=FORGER, password=site.password(FORGER))
        # A device login connects only with its own client id (protocol/acl.py), as the roles do.
        self.transport = MqttTransport(login, f"ea-{cluster}-{FORGER}", tls=TlsOptions(ca, cert, key))
        if not self.transport.wait_connected(30):
            raise RuntimeError(f"the forger could not log in to {url}")

    def forge(self, victim: str) -> None:
        """Idle announcements, as a restarted device or a new one would send: for a ghost and for
        ``victim``, on its own topic (the receivers must drop them: the payload names another device) and
        on theirs (the broker must refuse them: a login publishes only under its own id)."""
        own = self.topics.device(Family.ANNOUNCE, FORGER)
        for device in (GHOST, victim):
            msg = Announce(device_id=device)
            self.transport.publish(own, encode(msg, sender=device))
            self.transport.publish(self.topics.device(Family.ANNOUNCE, device), encode(msg, sender=device))
        self.transport.flush(5.0)

    def close(self) -> None:
        self.transport.close()


@dataclass
class Chaos:
    """Injects faults into a running cluster and waits, on what it says, for the run to go on."""

    work: Workload
    network: Network
    broker: Broker
    central: Service
    workers: dict[str, Service]
    observer: Observer
    progress: Progress
    forger: Forger
    total: int  # the run's batches
    startup: float  # seconds the central node took from its start to its first commit
    timers: list[threading.Timer] = field(default_factory=list)

    @property
    def stages(self) -> int:
        return self.work.workers + 1

    def window(self, fault: Fault, pace: float) -> float:
        """How long the run may take to get past a fault (see the module doc)."""
        replay = (max(self.work.global_every, self.work.chain_every) + 2 * self.stages) * pace * 4
        return (
            fault.seconds
            + self.startup
            + self.central.unit.restart_sec
            + self.work.restart_window
            + self.work.batch_timeout
            + replay
        )

    def later(self, seconds: float, action: Callable[[], Any]) -> None:
        """Undo a fault after its seeded duration (SIGCONT, a link up, the broker back)."""
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

    def _in_run(self, wanted: str) -> str:
        """``wanted`` if it is in the run now, else the next worker of the run after it (a NaN only goes
        out from a device that trains)."""
        current = list(self.observer.workers)
        if not current or wanted in current:
            return wanted
        ids = sorted(self.workers)
        order = ids[ids.index(wanted) :] + ids[: ids.index(wanted)]
        return next((w for w in order if w in current), wanted)

    def inject(self, fault: Fault) -> tuple[str, str]:
        """Do it; return (the target hit, a note)."""
        kind, target = fault.kind, fault.target
        if kind is Kind.WORKER_SIGKILL:
            svc = self.workers[target]
            svc.plan_exit("SIGKILL (fault)", fault.seconds)
            return target, f"pid {svc.signal(signal.SIGKILL)}"
        if kind is Kind.WORKER_SIGSTOP:
            svc = self.workers[target]
            pid = svc.signal(signal.SIGSTOP)
            self.later(fault.seconds, lambda: svc.signal(signal.SIGCONT))
            return target, f"pid {pid}"
        if kind is Kind.CENTRAL_SIGTERM:
            self.central.plan_exit("SIGTERM (systemctl restart)", 0.0)
            return target, f"pid {self.central.signal(signal.SIGTERM)}"
        if kind is Kind.CENTRAL_SIGKILL:
            self.central.plan_exit("SIGKILL (Restart=on-failure)", self.central.unit.restart_sec)
            return target, f"pid {self.central.signal(signal.SIGKILL)}"
        if kind is Kind.BROKER_RESTART:
            self.broker.stop()
            self.later(fault.seconds, self.broker.start)
            return target, f"port {self.broker.port}"
        if kind is Kind.LINK_DOWN:
            self.network.set_link(target, up=False)
            self.later(fault.seconds, lambda: self.network.set_link(target, up=True))
            return target, self.network.links[target].host_if
        if kind is Kind.NAN:
            target = self._in_run(target)
            return target, f"pid {self.workers[target].signal(signal.SIGUSR1)}"
        self.forger.forge(target)
        return target, f"as {FORGER}"

    def run(self, fault: Fault) -> Outcome | None:
        """Wait for the fault's moment, inject it, wait for the run to get past it. None: the run ended
        before the fault's batch."""
        reached = self.progress.wait_for(lambda c: c.batch >= fault.at, timeout=self._patience())
        if reached is None or self.central.finished.is_set():
            return None
        pace = self.progress.pace()
        pace = pace if pace == pace else 1.0  # NaN: no two consecutive commits yet
        if fault.lag > 0:
            # A seeded gap (not a synchronisation): the fault lands anywhere in a batch or an evaluation.
            time.sleep(fault.lag * pace)
        if fault.kind in (Kind.WORKER_SIGKILL, Kind.WORKER_SIGSTOP, Kind.NAN):
            # A device that is down (an earlier SIGKILL's restart still pending) is started first.
            self.workers[fault.target].wait_running(120)
        logs = self._log_sizes()
        in_run = list(self.observer.workers)
        now, batch = time.monotonic(), self.progress.highest()
        target, note = self.inject(fault)
        outcome = Outcome(fault, now, batch, target, self.window(fault, pace))
        if target in self.workers and in_run and target not in in_run:
            outcome.notes.append(f"{target} was not in the run (it trained on {', '.join(in_run)})")
        say(f"fault {fault.index}: {replace(fault, target=target).describe()} ({note}) after batch {batch}")
        # Past the fault: a batch not started at the fault committed, or the run finished (a fault in its
        # last evaluation). Not within the window: keep waiting (twice as long again) to tell late from never.
        goal = batch + self.stages + 1
        finished = self.central.finished.is_set
        done = None
        for timeout in (outcome.window, 2 * outcome.window):
            done = self.progress.wait_for(
                lambda c: c.batch >= goal, since=now, timeout=timeout, give_up=finished
            )
            if done is not None or finished():
                break
        if done is not None:
            end = done.t
        elif finished():
            end = self.central.lives[-1].ended or time.monotonic()
        else:
            end = time.monotonic()
        outcome.back = None if done is None and not finished() else end - now
        outcome.events = self.observer.timed_events(since=now, until=end)
        if fault.kind is Kind.FORGED_ANNOUNCE:
            outcome.problems += [
                f"{e.name} {e.details}" for _, e in outcome.events if e.name in ("fault", "recovery", "join")
            ]
            outcome.notes.append(self._forgeries_refused(logs))
        return outcome

    def _log_sizes(self) -> dict[str, int]:
        return {str(p): p.stat().st_size for p in (self.broker.log, self.central.log) if p.exists()}

    def _forgeries_refused(self, before: dict[str, int]) -> str:
        """How many forged announcements the broker refused and the central node dropped, from the lines
        their logs gained since the fault (both logs rate-limit repeated lines: a floor, not a count)."""
        refused = dropped = 0
        for path, offset in before.items():
            with open(path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
            refused += text.count(f"refused {FORGER} publishing")
            dropped += text.count(f"/device/{FORGER}/announce: sender")
        return f"broker refused {refused}, central node dropped {dropped} of 4 forged announcements"

    def _patience(self) -> float:
        """How long the next fault's batch may take to come: the whole rest of the run at a slow pace."""
        pace = self.progress.pace()
        pace = pace if pace == pace else 5.0  # NaN before two consecutive commits
        return 60.0 + 10 * pace * max(1, self.total - self.progress.highest())

    def close(self) -> None:
        for timer in self.timers:
            timer.cancel()


def forged_joins(observer: Observer) -> list[str]:
    """Joins of an identity that only the forger used: there must be none."""
    return [str(e.details) for e in observer.events("join") if e.details.get("device") in (GHOST, FORGER)]


__all__ = ["Chaos", "Fault", "Forger", "Kind", "Outcome", "forged_joins", "make_schedule"]
