"""A device's compute as the runtime accounts for it: where the time went, emulated slower devices."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class TimeAccount:
    """Where a role's time went: compute (emulated), communication (encoding and publishing), idle; and the
    bytes it sent and took in (payloads, as on the wire).

    The times are those of one thread, the role's own (the one that last called :meth:`reset`), so that
    they add up to at most its wall time: a send from another thread (replicas on the scheduler's thread,
    heartbeats, metrics) overlaps them and counts its bytes only (:meth:`sent`)."""

    compute: float = 0.0
    communication: float = 0.0
    idle: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    sent_bytes: int = 0
    received_bytes: int = 0
    thread: int = field(default_factory=threading.get_ident)

    def reset(self) -> None:
        self.compute = self.communication = self.idle = 0.0
        self.sent_bytes = self.received_bytes = 0
        self.started = time.perf_counter()
        self.thread = threading.get_ident()

    def sent(self, nbytes: int, seconds: float) -> None:
        """A message of ``nbytes`` that took ``seconds`` to encode and publish."""
        self.sent_bytes += nbytes
        if threading.get_ident() == self.thread:
            self.communication += seconds

    def summary(self) -> dict[str, float]:
        wall = time.perf_counter() - self.started
        return {"wall": wall, "compute": self.compute, "communication": self.communication, "idle": self.idle}

    def figures(self) -> dict[str, float | int]:
        """The account as a device's metrics carry it (``compute_s`` ... ``bytes_received``, see
        docs/protocol.md): every mode's devices publish these; the central node's report keeps them."""
        t = self.summary()
        return {
            "compute_s": round(t["compute"], 3),
            "communication_s": round(t["communication"], 3),
            "idle_s": round(t["idle"], 3),
            "wall_s": round(t["wall"], 3),
            "bytes_sent": self.sent_bytes,
            "bytes_received": self.received_bytes,
        }


class Clock:
    """Start of a compute step: wall time, and this thread's CPU time when the step's device is emulated
    ``factor`` > 1 times slower (:func:`emulate_slowdown` scales it).

    At a factor of 1 the CPU time is not read: ``time.thread_time`` is a system call that measured 160-280
    microseconds per call while the roles' threads contend for the cores (four per batch and stage).
    """

    __slots__ = ("cpu", "wall")

    def __init__(self, factor: float) -> None:
        self.wall = time.perf_counter()
        self.cpu: float | None = time.thread_time() if factor > 1.0 else None


def step_clock(factor: float) -> Callable[[], float]:
    """The clock a compute step of a device ``factor`` times slower is counted on: this thread's CPU time
    when the slowdown is emulated (what :func:`emulate_slowdown` scales), wall time otherwise."""
    return time.thread_time if factor > 1.0 else time.perf_counter


def emulate_slowdown(started: Clock, factor: float, account: TimeAccount | None = None) -> float:
    """Make a compute step take ``factor`` times the CPU time it really used; return its emulated duration.

    CPU time, not wall time, is scaled: several emulated devices share this machine's cores, and
    waiting for a core is not part of a device's compute time. (Torch runs with one thread per role,
    so the calling thread's CPU time is the step's compute.)
    """
    wall = time.perf_counter() - started.wall
    if factor <= 1.0 or started.cpu is None:  # not emulated (or the factor changed within this step)
        if account is not None:
            account.compute += wall
        return wall
    target = (time.thread_time() - started.cpu) * factor
    if target > wall:
        time.sleep(target - wall)
    duration = _duration(wall, target, factor)
    if account is not None:
        account.compute += duration
    return duration


def _duration(wall: float, target: float, factor: float) -> float:
    return max(target, wall) if factor > 1.0 else wall


def emulated_duration(started: Clock, factor: float) -> float:
    """The duration :func:`emulate_slowdown` would give a step started at ``started``, without sleeping:
    a measurement (``h``, data collection) of an emulated slower device."""
    wall = time.perf_counter() - started.wall
    if factor <= 1.0 or started.cpu is None:
        return wall
    return _duration(wall, (time.thread_time() - started.cpu) * factor, factor)


def configure_threads(threads: int) -> None:
    torch.set_num_threads(threads)
