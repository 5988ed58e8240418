"""The server's half of one mini-batch, and where it runs: one device's after another or in parallel.

PiPar (papers/003 Sec. 3.2.3, Fig. 3) keeps one server-side model per device. Fig. 3(b) trains them
one after another, so a late device's backward passes wait for the others' server compute; Fig. 3(c)
trains them in parallel (data parallelism across the devices' activations), which mitigates stragglers
"on a server with the cores". :class:`ServerSteps` is that choice: with one thread every mini-batch runs
on the caller's thread in arrival order (Fig. 3(b), the baseline); with more, a small pool runs
different devices' mini-batches at once while each device's still run one at a time in arrival order
(a model is never touched by two threads, and its updates are the sequential ones: the same arithmetic
in the same order, so the same bits). :func:`server_step` is the arithmetic, pure.

Note: torch's intra-op threads are shared by every Python thread, so a pool only pays where the cores
outnumber them (:func:`auto_threads`); the default sizes it from ``os.cpu_count()`` and
``torch.get_num_threads()``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import nn

from edgeagent.pipeline.sgd import SGD

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    """What one server-side mini-batch gives back: the gradient w.r.t. the activation (scaled by 1/N),
    the mini-batch's loss, how many rows it got right, and whether the model updated (its N-th)."""

    grad: torch.Tensor
    loss: float
    correct: int
    updated: bool


def server_step(
    model: nn.Module, optimizer: SGD, x: torch.Tensor, y: torch.Tensor, parallel: int, done: int
) -> StepResult:
    """Forward and backward of one mini-batch on a server-side model (Algorithm 2, lines 7-13): the loss
    is scaled by ``1 / parallel`` so that the ``parallel`` mini-batches of an iteration sum to the batch's
    gradient; ``done`` is how many of them were back-propagated before this one, and the ``parallel``-th
    updates the model (line 15)."""
    leaf = x.detach().requires_grad_(True)  # (B', *activation)
    out = model(leaf)
    loss = nn.functional.cross_entropy(out, y)
    (loss / parallel).backward()
    assert leaf.grad is not None
    updated = done + 1 == parallel
    if updated:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return StepResult(leaf.grad, float(loss.detach()), int((out.argmax(1) == y).sum()), updated)


def auto_threads(devices: int, cpus: int | None = None, torch_threads: int | None = None) -> int:
    """Server threads worth running: the cores over torch's intra-op threads (each model's forward and
    backward already use those), at most one per device, at least one (sequential)."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    torch_threads = torch_threads if torch_threads is not None else torch.get_num_threads()
    return max(1, min(devices, cpus // max(1, torch_threads)))


class ServerSteps:
    """Runs work keyed by device: each key's in submission order, one at a time; different keys' at once
    on up to ``threads`` threads (1: on the submitting thread, at once). See the module doc."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"server threads must be >= 1, got {threads}")
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="server-side") if threads > 1 else None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queues: dict[Hashable, deque[Callable[[], None]]] = {}
        self._running: set[Hashable] = set()
        self.failures = 0

    @property
    def parallel(self) -> bool:
        return self._pool is not None

    def submit(self, key: Hashable, work: Callable[[], None]) -> None:
        """Run ``work`` after every earlier work of ``key``. Sequential: now, here, and what it raises
        reaches the caller (the node's handler, as before the pool); on the pool it is logged and
        counted, and the other devices' work goes on."""
        if self._pool is None:
            work()
            return
        with self._lock:
            self._queues.setdefault(key, deque()).append(work)
            if key in self._running:
                return
            self._running.add(key)
        self._pool.submit(self._drain, key)

    def _drain(self, key: Hashable) -> None:
        while True:
            with self._lock:
                queue = self._queues.get(key)
                if not queue:
                    self._running.discard(key)
                    self._queues.pop(key, None)
                    self._idle.notify_all()
                    return
                work = queue.popleft()
            self._run(work)

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception:  # one device's bad mini-batch must not stop the others' (nor the pool)
            self.failures += 1
            log.exception("a server-side mini-batch failed")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no work is queued or running; False if ``timeout`` ran out first."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._running, timeout)

    def close(self) -> None:
        """Finish what is queued, then stop the threads."""
        if self._pool is not None:
            self.wait()
            self._pool.shutdown(wait=True)
            self._pool = None


__all__ = ["ServerSteps", "StepResult", "auto_threads", "server_step"]
