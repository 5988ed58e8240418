"""Where a data-plane message's time goes, hop by hop: timestamps for the per-hop cost breakdown.

Off (one ``None`` check per message) unless ``EDGEAGENT_HOP_TRACE`` names a directory when the process
starts; each process then writes ``<wall time> <event> <topic> <batch id>`` lines to
``DIR/<pid>.trace`` for every message that carries a batch id (activations, gradients, results), at:

* ``encode``: the role's thread starts encoding it (sender),
* ``publish``: encoded, handed to the transport (sender),
* ``sent``: the transport's ``publish`` returned (sender),
* ``arrive``: the network thread has the whole payload (receiver),
* ``decoded``: limits, decoding and checks done, queued for the role's thread (receiver),
* ``taken``: the role's thread dispatches it (receiver);

and a stage's compute steps: ``forward`` or ``backward`` (its start, on topic ``stage/<i>/compute``),
then ``computed`` (its end; the emulated slowdown included).

:func:`breakdown` pairs a sender's ``publish`` with the receiver's ``arrive`` of the same topic and batch
(wall clocks: one machine, or clocks in sync) and adds the compute a stage spends between taking a message
and encoding the next. ``bench/pipeline.py --hops`` prints it.
"""

from __future__ import annotations

import atexit
import os
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ENV = "EDGEAGENT_HOP_TRACE"
EVENTS = ("encode", "publish", "sent", "arrive", "decoded", "taken", "forward", "backward", "computed")


class HopTrace:
    """One process's trace file (buffered; flushed when the process exits)."""

    def __init__(self, directory: str) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(  # noqa: SIM115 - open for the process's life
            os.path.join(directory, f"{os.getpid()}.trace"), "a", encoding="utf-8", buffering=1 << 16
        )
        self._lock = threading.Lock()  # the role's thread and the network thread both write
        atexit.register(self.flush)

    def mark(self, event: str, topic: str, batch_id: int, t: float | None = None) -> None:
        line = f"{time.time() if t is None else t:.6f} {event} {topic} {batch_id}\n"
        with self._lock:
            self._file.write(line)

    def flush(self) -> None:
        with self._lock:
            self._file.flush()


def _from_env() -> HopTrace | None:
    directory = os.environ.get(ENV)
    return HopTrace(directory) if directory else None


TRACE: HopTrace | None = _from_env()


def mark(event: str, topic: str, message: object, t: float | None = None) -> None:
    """Record ``event`` (at ``t``, wall time, or now) for ``message`` if tracing is on and the message
    carries a batch id."""
    if TRACE is None:
        return
    batch_id = getattr(message, "batch_id", None)
    if isinstance(batch_id, int):
        TRACE.mark(event, topic, batch_id, t)


def compute(kind: str, stage: int, batch_id: int, started: float) -> None:
    """Record a compute step (``forward``/``backward``) of ``stage`` that began at ``started``
    (``time.perf_counter``) and ends now, if tracing is on."""
    if TRACE is None:
        return
    end, wall = time.time(), time.perf_counter()
    topic = f"stage/{stage}/compute"
    TRACE.mark(kind, topic, batch_id, end - (wall - started))
    TRACE.mark("computed", topic, batch_id, end)


def flush() -> None:
    """Write out the buffered records (at exit; ``atexit`` does not run when a process leaves with
    ``os._exit``, as the ``edgeagent`` program does)."""
    if TRACE is not None:
        TRACE.flush()


def now() -> float:
    """The trace's clock (wall time), or 0 when tracing is off (not read then)."""
    return time.time() if TRACE is not None else 0.0


@dataclass(frozen=True)
class Record:
    t: float
    event: str
    topic: str
    batch_id: int
    process: str


def read(directory: str | Path) -> list[Record]:
    """Every record of every process's trace file in ``directory`` (malformed lines skipped)."""
    records = []
    for path in sorted(Path(directory).glob("*.trace")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[1] in EVENTS and parts[3].lstrip("-").isdigit():
                records.append(Record(float(parts[0]), parts[1], parts[2], int(parts[3]), path.stem))
    return records


def _kind(topic: str) -> str:
    """``stage/1/act/worker-1`` -> ``stage 1 act``: the hop's name in the breakdown."""
    parts = topic.split("/")
    if "stage" in parts:
        i = parts.index("stage")
        return " ".join(["stage", *parts[i + 1 : i + 3]])
    return topic


def breakdown(records: Iterable[Record], *, skip: int = 20) -> dict[str, dict[str, float]]:
    """Median milliseconds per hop (a topic family: ``stage 0 act`` ...) of each part of its way, over the
    batches after the first ``skip`` (start-up): encode, publish (the sender's thread in the transport's
    ``publish``), relay (handed to the transport -> the receiver's network thread has it: the socket
    writes, broker, network, the receiver's socket), decode (limits, decoding, checks), queue (waiting for
    the role's thread); and per stage (``stage i compute``) its forward and backward steps (on the last
    stage of a worker, forward and backward are one step). Encode, relay, decode and queue follow each
    other; publish overlaps relay: the transport writes to the socket in the sender's call, so the receiver
    can have the message before that call returns (relay from ``sent`` went negative: -1 to -3.5 ms for
    MobileNetV2's 130-260 kB activations through Mosquitto on a loaded 2-core machine)."""
    at: dict[tuple[str, int, str], float] = {}
    by_process: dict[tuple[str, int], list[Record]] = defaultdict(list)
    for r in records:
        at.setdefault((r.topic, r.batch_id, r.event), r.t)
        by_process[(r.process, r.batch_id)].append(r)
    parts: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (topic, batch_id, event), t in at.items():
        if event != "sent" or batch_id < skip:
            continue
        hop = parts[_kind(topic)]
        get = at.get
        pairs = [
            ("encode", get((topic, batch_id, "encode")), get((topic, batch_id, "publish"))),
            ("publish", get((topic, batch_id, "publish")), t),
            ("relay", get((topic, batch_id, "publish")), get((topic, batch_id, "arrive"))),
            ("decode", get((topic, batch_id, "arrive")), get((topic, batch_id, "decoded"))),
            ("queue", get((topic, batch_id, "decoded")), get((topic, batch_id, "taken"))),
        ]
        for name, start, end in pairs:
            if start is not None and end is not None:
                hop[name].append(end - start)
    for (_, batch_id), recs in by_process.items():
        if batch_id < skip:
            continue
        recs.sort(key=lambda r: r.t)
        for i, r in enumerate(recs):
            if r.event in ("forward", "backward"):
                done = next((n for n in recs[i + 1 :] if n.event == "computed" and n.topic == r.topic), None)
                if done is not None:
                    parts[_kind(r.topic)][r.event].append(done.t - r.t)
    return {
        hop: {name: 1e3 * statistics.median(values) for name, values in sorted(items.items()) if values}
        for hop, items in sorted(parts.items())
    }
