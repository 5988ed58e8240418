"""Deadlines derived from what was measured (pure policy; the central node wires it to its clocks).

FTPipeHD's fault detection is a timer per batch (papers/000 Sec. III-F): no gradients back in time
means a fault. A fixed timer is wrong by an order of magnitude on one side or the other: a Pi is
10-50x slower than the laptop it is tested on. Every deadline here is the predicted time of the work
that is outstanding, times a multiplier, never less than a floor:

* **batch**: a batch sent by stage 0 comes back after it waited behind the other batches in flight
  (Little's law: ``bound`` steps of the bottleneck, at least one pass through every stage) and crossed
  every link twice: ``max(bound, stages) * step``, with ``step`` the DP's predicted time per batch of
  the current split (eq. 4-7 with measured capacities and links).
  A gradient may also wait behind replicas (weights and momentum of a whole stage) queued on a slow
  uplink at a replication point: ``queued``, the seconds those take on the slowest link, is added on
  top (it is not work to scale, and it does not shrink the floor).
* **evaluation result**: the same for one evaluation chunk, scaled by how much larger an evaluation
  chunk is than a training batch; the clock restarts at every result, so a long test set on a slow
  cluster is never cut off as long as results keep coming.
* **measurement**: a device asked to measure its ``h`` again (papers/004 Sec. 3.2) stops its stage while it
  measures; the batches in flight wait for it. It may take ``multiplier`` x what its last measurement
  took (it announced that), at least the batch floor; and after its new ``h`` arrives, the batches in
  flight get a whole batch deadline again.
* **probe**: a live device answers the probe after it finishes the computation it is in: the slowest
  stage's step and a round trip on the slowest link.
* **barrier** (mid-run: the layers a re-split or a recovery moves, the replicas every device sends
  before it says "built", the final collection of the weights): the bytes that must cross the slowest
  measured link, over its bandwidth, and a round trip; at least ``barrier_floor`` (what a device may
  take to build a stage: the start-up timeout). Running out of it is a fault the run recovers from.
* **heartbeats** (:func:`silence`): a device is gone after ``MISSED_HEARTBEATS`` of *its own* heartbeat
  intervals (a device profile may set up to 60 s), never fewer seconds than the central node's own
  interval allows, plus the time its uplink may be busy with what is queued ahead of a heartbeat.
* **reassembly** (:func:`reassembly_stall`): a message in chunks is forgotten only when its chunks
  stop coming: no new one for ``multiplier`` x the longest gap between its chunks so far, at least a
  floor. A multi-MB replica on a 0.5 Mbit/s link takes minutes, and it is never cut off while it moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MISSED_HEARTBEATS = 3
MAX_HEARTBEAT_INTERVAL = 60.0  # seconds; what a device profile may set (ops/profiles.py): a longer one
# announced would keep a dead device "alive" until its last will
REASSEMBLY_FLOOR = 60.0  # seconds without a chunk before the first gap is known: one 768 KiB chunk at
# 0.1 Mbit/s

# Forward only, larger batches: an evaluation chunk costs ``eval/train batch size`` times this share of
# a training step (forward + backward is about 3 forwards; 1/2 leaves room for a slow first chunk).
EVAL_SHARE = 0.5


@dataclass(frozen=True)
class Deadlines:
    """``floor`` seconds at least; else ``multiplier`` x the predicted time of the outstanding work."""

    multiplier: float = 4.0
    batch_floor: float = 10.0
    probe_floor: float = 1.0
    barrier_floor: float = 60.0

    def __post_init__(self) -> None:
        for name in ("multiplier", "batch_floor", "probe_floor", "barrier_floor"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} = {value} must be a finite number > 0")

    def _scaled(self, predicted: float, floor: float) -> float:
        if not (math.isfinite(predicted) and predicted >= 0):
            raise ValueError(f"predicted time {predicted} s must be finite and >= 0")
        return max(floor, self.multiplier * predicted)

    def batch(self, step: float, *, stages: int, bound: int, queued: float = 0.0) -> float:
        """Seconds after stage 0 sent a batch before its missing gradients are a fault; ``queued``: the
        seconds of replica traffic that may be ahead of them on the slowest uplink."""
        if not (math.isfinite(queued) and queued >= 0):
            raise ValueError(f"queued time {queued} s must be finite and >= 0")
        return self._scaled(max(bound, stages, 1) * step, self.batch_floor) + queued

    def evaluation(self, step: float, *, stages: int, bound: int, eval_batch: int, train_batch: int) -> float:
        """Seconds without a new evaluation result (while some are due) before that is a fault."""
        scale = max(1.0, EVAL_SHARE * eval_batch / max(1, train_batch))
        return self._scaled(max(bound, stages, 1) * step * scale, self.batch_floor)

    def measurement(self, last_seconds: float) -> float:
        """Seconds a device asked to measure its ``h`` again may be away from its stage; ``last_seconds``:
        what its previous measurement took (0: unknown, the floor)."""
        return self._scaled(last_seconds, self.batch_floor)

    def probe(self, slowest_stage: float, slowest_round_trip: float) -> float:
        """Seconds to wait for the devices of the run to answer a probe after a fault."""
        return self._scaled(slowest_stage + slowest_round_trip, self.probe_floor)

    def barrier(self, nbytes: float, bandwidth: float, *, latency: float = 0.0, queued: float = 0.0) -> float:
        """Seconds a mid-run barrier may take: ``nbytes`` over a link of ``bandwidth`` bytes/s (inf: not
        measured yet) and a round trip of ``latency`` each way; ``queued``: seconds of traffic already
        ahead on that link (added on top, like the batch timer's)."""
        if not (bandwidth > 0 and nbytes >= 0 and math.isfinite(nbytes)):
            raise ValueError(f"{nbytes} bytes over {bandwidth} bytes/s: need bytes >= 0 and bandwidth > 0")
        if not (math.isfinite(queued) and queued >= 0):
            raise ValueError(f"queued time {queued} s must be finite and >= 0")
        return self._scaled(nbytes / bandwidth + 2 * latency, self.barrier_floor) + queued


def silence(interval: float, *, floor: float, slack: float = 0.0, missed: int = MISSED_HEARTBEATS) -> float:
    """Seconds without any sign of life before a device counts as gone: ``missed`` heartbeat intervals of
    the device's own (``interval``, as its heartbeats announce it), the interval taken as at least
    ``floor`` (the central node's own) and at most :data:`MAX_HEARTBEAT_INTERVAL`; ``slack``: seconds
    its uplink may be busy with what is queued ahead of a heartbeat."""
    if not (math.isfinite(interval) and interval > 0):
        interval = floor  # a heartbeat without a usable interval (an old device): the central node's
    return missed * min(MAX_HEARTBEAT_INTERVAL, max(interval, floor)) + slack


def reassembly_stall(
    longest_gap: float, *, floor: float = REASSEMBLY_FLOOR, multiplier: float = 4.0
) -> float:
    """Seconds without a new chunk after which a partial message is forgotten: ``multiplier`` x the
    longest gap between its chunks so far (0 after its first: the floor), at least ``floor``."""
    return max(floor, multiplier * max(0.0, longest_gap))


__all__ = [
    "EVAL_SHARE",
    "MAX_HEARTBEAT_INTERVAL",
    "MISSED_HEARTBEATS",
    "REASSEMBLY_FLOOR",
    "Deadlines",
    "reassembly_stall",
    "silence",
]
