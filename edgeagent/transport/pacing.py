"""An emulated slow uplink and the bulk lane's rules (issue 52): pure timing, no sockets.

:class:`LinkThrottle` makes every frame a transport sends occupy the link for ``bytes / rate`` seconds
(``--link-mbps``); the bulk lane (replicas, ``MqttTransport.publish_bulk``) sends short frames
(:func:`bulk_frame_bytes`) in the link's idle time within a share of it (:func:`bulk_slot`,
:func:`bulk_grace`).
"""

from __future__ import annotations

import threading
import time

from edgeagent.errors import ConfigError


class LinkThrottle:
    """Emulates a slow uplink: each frame occupies the link for ``bytes / rate`` seconds, one after another.

    The sender blocks until its frame has "left", as it would on a saturated real link; frames from
    several threads queue behind each other. Bulk frames (replicas, :meth:`wait_bulk`) are the low
    priority lane: see :func:`bulk_slot`.
    """

    def __init__(self, megabits_per_second: float, *, emulate: bool = True) -> None:
        if megabits_per_second <= 0:
            raise ConfigError(f"link rate must be > 0 Mbit/s, got {megabits_per_second}")
        self.bytes_per_second = megabits_per_second * 1e6 / 8
        # False: a real link of this measured rate. Frames are booked on it (the bulk lane then finds its
        # idle time) but not held back: the link itself holds them.
        self.emulate = emulate
        self._next_free = 0.0
        self._bulk_next = 0.0  # when the bulk lane may start its next frame (its share of the link)
        self._lock = threading.Lock()
        self.sent_bytes = 0
        self.bulk_bytes = 0

    def wait(self, nbytes: int) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_free)
            self._next_free = start + nbytes / self.bytes_per_second
            delay = self._next_free - now
            self.sent_bytes += nbytes
        if delay > 0 and self.emulate:
            time.sleep(delay)

    def wait_bulk(self, nbytes: int, share: float, grace: float | None = None) -> None:
        """Block until a bulk frame of ``nbytes`` has left, sent in the link's idle time and within
        ``share`` of its bandwidth (:func:`bulk_slot`). ``grace`` (default: ``BULK_GRACE_RESTS`` rests of
        the lane after this frame) is how long past its turn it waits for an idle link: on a link that
        stays busy the lane still gets about ``share / (1 + BULK_GRACE_RESTS)`` of it."""
        duration = nbytes / self.bytes_per_second
        if grace is None:
            grace = bulk_grace(duration, share)
        while True:
            with self._lock:
                now = time.monotonic()
                start = bulk_slot(now, self._next_free, self._bulk_next, duration, share, grace)
                if start is not None:
                    self._next_free = start + duration
                    self._bulk_next = start + duration / share
                    self.sent_bytes += nbytes
                    self.bulk_bytes += nbytes
                    left = self._next_free - now
                else:  # look again when the lane's turn comes or the link frees, at least every 50 ms
                    retry = min(max(self._bulk_next - now, self._next_free - now, 0.002), 0.05)
            if start is not None:
                time.sleep(left)
                return
            time.sleep(retry)


BULK_FRAME_SECONDS = 0.025  # a bulk frame holds the link this long (1.5 kB at 0.5 Mbit/s, 12.5 kB at 4)
BULK_FRAME_MIN = 1024  # but carries at least this many bytes (the chunk framing is 96 of them)
BULK_GRACE_RESTS = 2.0  # wait_bulk's default grace, in rests of the lane


def bulk_frame_bytes(bytes_per_second: float, limit: int) -> int:
    """The size of the bulk lane's frames on a link of ``bytes_per_second``: ``BULK_FRAME_SECONDS`` of it,
    at least ``BULK_FRAME_MIN`` bytes, at most ``limit`` (the transport's chunk size). An activation or
    gradient that comes while a frame is on the link waits for the rest of it, so frames are short: with
    8 kB frames (0.13 s at 0.5 Mbit/s) 2-bit training ran at 0.76x its speed without replicas; 25 ms frames
    keep activations and gradients flowing between them."""
    return int(min(limit, max(BULK_FRAME_MIN, bytes_per_second * BULK_FRAME_SECONDS)))


def bulk_grace(duration: float, share: float) -> float:
    """How long past its turn a bulk frame of ``duration`` seconds waits for an idle link before it queues
    behind what is reserved: ``BULK_GRACE_RESTS`` rests of the lane, so that on a link something else keeps
    busy the lane still gets ``share / (1 + BULK_GRACE_RESTS)`` of it (a replica arrives in bounded time)."""
    if not 0 < share <= 1:
        raise ConfigError(f"bulk share must be in (0, 1], got {share}")
    return BULK_GRACE_RESTS * duration / share


def bulk_slot(
    now: float, next_free: float, bulk_next: float, duration: float, share: float, grace: float
) -> float | None:
    """When a bulk frame of ``duration`` seconds may start on a link free from ``next_free`` on, or
    None (not yet).

    Rule: the bulk lane may start a frame only once its share allows (``bulk_next``: after a frame of
    d seconds it rests d (1 - share) / share, so it takes at most ``share`` of the link), and then
    only on an idle link (no activation or gradient frame holds or has reserved it: those reserve
    ``next_free`` when they are sent). On a link that stays busy it still gets through: after
    ``grace`` seconds past its turn it queues behind what is reserved, like any frame, so a replica
    arrives in bounded time (about its size over ``share`` of the rate, plus a grace per frame).
    """
    if not 0 < share <= 1:
        raise ConfigError(f"bulk share must be in (0, 1], got {share}")
    if now < bulk_next:
        return None
    if next_free <= now:
        return now
    if now >= bulk_next + grace:
        return next_free
    return None


__all__ = [
    "BULK_FRAME_MIN",
    "BULK_FRAME_SECONDS",
    "BULK_GRACE_RESTS",
    "LinkThrottle",
    "bulk_frame_bytes",
    "bulk_grace",
    "bulk_slot",
]
