"""``--nan-on-usr1 KIND`` (fault injection for bench/chaos.py): each SIGUSR1 poisons one outgoing message."""

from __future__ import annotations

import os
import signal

import torch

from edgeagent.config import WorkerConfig
from edgeagent.modes import mode
from edgeagent.roles.worker import Worker
from edgeagent.transport.memory import MemoryBroker, MemoryTransport


def test_each_signal_fills_the_next_message_of_its_kind_with_nan() -> None:
    config = WorkerConfig(device_id="w", cluster="nan-on-usr1", nan_on_usr1="gradient")
    worker = Worker(config, MemoryTransport(MemoryBroker(), "w"), modes=mode)
    g = torch.ones(4, 3)
    assert worker.poisoned("gradient", 1, g) is g  # nothing until a signal
    previous = signal.signal(signal.SIGUSR1, lambda *_: worker.arm_nan())
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert worker.poisoned("activation", 2, g) is g  # another kind leaves it armed
        assert torch.isnan(worker.poisoned("gradient", 2, g)).all()
        assert worker.poisoned("gradient", 3, g) is g  # one message per signal
        os.kill(os.getpid(), signal.SIGUSR1)
        assert torch.isnan(worker.poisoned("gradient", 9, g)).all()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        worker.transport.close()
