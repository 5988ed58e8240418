"""Which batch updates every stage applied: an audit log, off unless ``EDGEAGENT_AUDIT_DIR`` is set.

Note: why and how.
    "No update is lost or applied twice" (docs/design.md, "Recovery") is a claim about batch ids, which
    the weights cannot show once faults, rollbacks, replays, re-splits and restarts of every process have
    gone by. With ``EDGEAGENT_AUDIT_DIR`` set, every process appends one JSON line per event to its own
    file in that directory (``<pid>-<random>.jsonl``)::

        {"t": 81.2, "pid": 4242, "ev": "process", "argv": ["edgeagent", "worker", ...]}
        {"t": 85.0, "pid": 4242, "ev": "build", "copy": 3, "stage": 1, "layers": [2, 4], "v": 40,
         "seeded": false}
        {"t": 85.4, "pid": 4242, "ev": "apply", "copy": 3, "b": 40, "v": 40}

    A *copy* is one stage object a process built (``pipeline.build.make_stage``): its layers ``[a, b)``,
    the weight version it was built at and whether it took the seeded initial weights (no weights given);
    an ``apply`` is the update of batch ``b`` applied to that copy at version ``v``. ``t`` is
    ``CLOCK_MONOTONIC``, one clock for every process of a machine, so the files of a run merge by time.
    The file is line-buffered: each line is one ``write(2)``, and a SIGKILL loses nothing written before.
    Off (the default), a stage pays one ``is None`` test per update.

    :func:`check` rebuilds each layer's lineage, the batches whose updates its weights hold, across
    processes and devices: a build at version ``V`` restores the state the layer had when some copy was
    last at ``V`` (a rollback undoes the updates of batches ``>= V``; a layer that moved to another device
    carries its lineage with it); an apply of ``b`` extends its copy's. At the end the copy that last
    built or updated a layer holds it, and its lineage must be exactly ``0 .. N-1``, once each, in order.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

AUDIT_ENV = "EDGEAGENT_AUDIT_DIR"


# -- writing ---------------------------------------------------------------------------------------


class AuditLog:
    """One process's audit file (see the module doc)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.pid = os.getpid()
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{self.pid}-{secrets.token_hex(4)}.jsonl"
        self._file: IO[str] = self.path.open("a", buffering=1, encoding="utf-8")  # a line: one write(2)
        self._copies = itertools.count(1)
        self._lock = threading.Lock()
        self._write({"ev": "process", "argv": sys.argv})

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"t": round(time.monotonic(), 6), "pid": self.pid, **record}, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def built(self, stage: int, start: int, end: int, version: int, *, seeded: bool) -> int:
        copy = next(self._copies)
        record = {"ev": "build", "copy": copy, "stage": stage, "layers": [start, end], "v": version}
        self._write({**record, "seeded": seeded})
        return copy

    def applied(self, copy: int, batch: int, version: int) -> None:
        self._write({"ev": "apply", "copy": copy, "b": batch, "v": version})


_log: AuditLog | None = None
_log_pid = 0  # the process that opened _log (a forked child opens its own)


def current() -> AuditLog | None:
    """This process's audit log, opened at the first call if ``EDGEAGENT_AUDIT_DIR`` is set; else None."""
    global _log, _log_pid
    if _log_pid != os.getpid():
        directory = os.environ.get(AUDIT_ENV)
        _log, _log_pid = (AuditLog(directory) if directory else None), os.getpid()
    return _log


def built(stage: int, start: int, end: int, version: int, *, seeded: bool) -> int | None:
    """Record a stage copy built at ``version`` for layers ``[start, end)``; its id, or None when off."""
    log = current()
    return None if log is None else log.built(stage, start, end, version, seeded=seeded)


def applied(copy: int, batch: int, version: int) -> None:
    """Record the update of ``batch`` applied at ``version`` to copy ``copy`` (an id :func:`built` gave)."""
    log = current()
    if log is not None:
        log.applied(copy, batch, version)


# -- reading and checking (pure) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One line of an audit file: a build or an apply (``kind``) of copy ``copy`` of process ``pid``."""

    t: float
    pid: int
    copy: int
    kind: Literal["build", "apply"]
    version: int
    batch: int = -1  # apply: the batch whose update it is
    stage: int = -1  # build: the stage index
    layers: tuple[int, int] = (0, 0)  # build: [start, end)
    seeded: bool = False  # build: the seeded initial weights (none given)

    @classmethod
    def build(
        cls, t: float, pid: int, copy: int, layers: tuple[int, int], version: int, *, stage: int = -1,
        seeded: bool = False,
    ) -> Event:  # fmt: skip
        return cls(t, pid, copy, "build", version, stage=stage, layers=layers, seeded=seeded)

    @classmethod
    def apply(cls, t: float, pid: int, copy: int, batch: int, version: int) -> Event:
        return cls(t, pid, copy, "apply", version, batch=batch)


def parse_line(line: str) -> Event | None:
    """The event of one audit line; None for the process header, a torn last line or a foreign one."""
    try:
        r = json.loads(line)
        if r["ev"] == "build":
            a, b = r["layers"]
            return Event.build(
                float(r["t"]), int(r["pid"]), int(r["copy"]), (int(a), int(b)), int(r["v"]),
                stage=int(r["stage"]), seeded=bool(r["seeded"]),
            )  # fmt: skip
        if r["ev"] == "apply":
            return Event.apply(float(r["t"]), int(r["pid"]), int(r["copy"]), int(r["b"]), int(r["v"]))
    except (ValueError, KeyError, TypeError):
        pass
    return None


def read_dir(directory: str | os.PathLike[str]) -> list[Event]:
    """Every event of every audit file in ``directory``, in time order (a process's own in file order)."""
    events: list[tuple[float, int, int, Event]] = []
    for n, path in enumerate(sorted(Path(directory).glob("*.jsonl"))):
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
            event = parse_line(line)
            if event is not None:
                events.append((event.t, n, i, event))
    return [e for *_, e in sorted(events, key=lambda x: x[:3])]


# A lineage as a persistent list: (batch, the lineage before it, its length). Applies and rollbacks are
# O(1) and every version a copy reached stays available to later builds without copying.
_Node = tuple[int, "_Node | None", int]


def _length(node: _Node | None) -> int:
    return 0 if node is None else node[2]


def _batches(node: _Node | None) -> list[int]:
    out = []
    while node is not None:
        out.append(node[0])
        node = node[1]
    return out[::-1]


@dataclass
class _Copy:
    layers: range
    version: int


@dataclass
class Verdict:
    """What :func:`check` found. Per layer: the batches of its final lineage, those missing from it
    (``lost``) and those in it more than once or beyond the run (``twice``); ``anomalies``: everything
    along the way that breaks the rules, even on a copy that was later thrown away."""

    total: int
    lineages: dict[int, list[int]] = field(default_factory=dict)
    lost: dict[int, list[int]] = field(default_factory=dict)
    twice: dict[int, list[int]] = field(default_factory=dict)
    out_of_order: dict[int, int] = field(default_factory=dict)  # layer -> first position out of order
    anomalies: list[str] = field(default_factory=list)

    @property
    def lost_count(self) -> int:
        return sum(len(v) for v in self.lost.values())

    @property
    def twice_count(self) -> int:
        return sum(len(v) for v in self.twice.values())

    @property
    def ok(self) -> bool:
        complete = all(lineage == list(range(self.total)) for lineage in self.lineages.values())
        return complete and bool(self.lineages) and not self.anomalies


class _Lineages:
    """The replay of events behind :func:`check`: every copy's lineage per layer, and the lineage each
    layer last had at each version (what a later build at that version restores)."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.copies: dict[tuple[int, int], _Copy] = {}
        self.state: dict[tuple[int, int, int], _Node | None] = {}  # (pid, copy, layer) -> lineage
        self.reached: dict[tuple[int, int], _Node | None] = {}  # (layer, version) -> lineage there
        self.holder: dict[int, tuple[int, int]] = {}  # layer -> the copy that last built or updated it

    def anomaly(self, e: Event, text: str) -> None:
        self.verdict.anomalies.append(f"t={e.t:.3f} pid {e.pid} copy {e.copy}: {text}")

    def build(self, e: Event) -> None:
        key = (e.pid, e.copy)
        copy = self.copies[key] = _Copy(range(*e.layers), e.version)
        for layer in copy.layers:
            node: _Node | None = None
            if e.seeded:
                # The seeded weights are version 0's whatever the copy is labelled: a placeholder that a
                # switch replaces before any update (case 2) is fine; an update on it shows as a gap.
                if e.version == 0:
                    self.reached[(layer, 0)] = None
            elif (layer, e.version) in self.reached:
                node = self.reached[(layer, e.version)]
            else:
                self.anomaly(e, f"layer {layer} built at version {e.version}, which no copy of it reached")
            self.state[(*key, layer)] = node
            self.holder[layer] = key

    def apply(self, e: Event) -> None:
        key = (e.pid, e.copy)
        copy = self.copies.get(key)
        if copy is None:
            self.anomaly(e, "an update on a copy never built")
            return
        if e.batch != e.version or e.version != copy.version:
            self.anomaly(e, f"batch {e.batch} applied at version {e.version} (the copy at {copy.version})")
        copy.version = e.version + 1
        for layer in copy.layers:
            before = self.state[(*key, layer)]
            if _length(before) != e.batch:
                what = "already holds" if _length(before) > e.batch else "lacks batches before"
                self.anomaly(
                    e,
                    f"batch {e.batch} applied to layer {layer}, which {what} it "
                    f"(its lineage has {_length(before)} updates)",
                )
            node: _Node = (e.batch, before, _length(before) + 1)
            self.state[(*key, layer)] = node
            self.reached[(layer, copy.version)] = node
            self.holder[layer] = key

    def final(self, layer: int) -> list[int] | None:
        key = self.holder.get(layer)
        return None if key is None else _batches(self.state[(*key, layer)])


def check(events: Iterable[Event], *, total: int | None = None, layers: int | None = None) -> Verdict:
    """Rebuild every layer's lineage from ``events`` (in time order) and compare it with ``0 .. total-1``
    (``total``: the run's batches; default: the highest batch applied, plus one). ``layers``: how many the
    model has; a layer no copy ever held is reported."""
    events = list(events)
    if total is None:
        total = 1 + max((e.batch for e in events if e.kind == "apply"), default=-1)
    verdict = Verdict(total)
    replay = _Lineages(verdict)
    for e in events:
        if e.kind == "build":
            replay.build(e)
        else:
            replay.apply(e)
    held = sorted(replay.holder)
    for layer in sorted(set(held) | set(range(layers or 0))):
        lineage = replay.final(layer)
        if lineage is None:
            verdict.anomalies.append(f"layer {layer}: no copy ever held it")
            verdict.lost[layer] = list(range(total))
            continue
        verdict.lineages[layer] = lineage
        counts = Counter(lineage)
        lost = [b for b in range(total) if b not in counts]
        twice = sorted(b for b, c in counts.items() if c > 1 or b >= total)
        if lost:
            verdict.lost[layer] = lost
        if twice:
            verdict.twice[layer] = twice
        wrong = next((i for i, b in enumerate(lineage) if i > 0 and b < lineage[i - 1]), None)
        if wrong is not None:
            verdict.out_of_order[layer] = wrong
    return verdict


__all__ = [
    "AUDIT_ENV",
    "AuditLog",
    "Event",
    "Verdict",
    "applied",
    "built",
    "check",
    "current",
    "parse_line",
    "read_dir",
]
