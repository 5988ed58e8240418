"""Data-parallel training (``--mode allreduce``): every device holds a full replica and a shard of the data;
every step each computes the gradient of its batch and the devices average them with a collective, so all
replicas stay identical (papers/001, the fault-tolerant tree allreduce, and its baselines).

The collectives are pure state machines (:mod:`edgeagent.allreduce`, ``--collective``); the central node's
half is :class:`~edgeagent.modes.allreduce.central.AllreduceRun` (ranks, steps, membership, evaluation, the
report), the worker's :class:`~edgeagent.modes.allreduce.worker.AllreduceSession` (the replica, the links,
the collective's deadlines, ``--fail-link``). Both are imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from edgeagent.data import Dataset
    from edgeagent.models import ModelSpec
    from edgeagent.modes.allreduce.central import AllreduceRun
    from edgeagent.protocol.messages import Assign
    from edgeagent.roles.central import Central
    from edgeagent.roles.mode import WorkerSession
    from edgeagent.roles.worker import Worker


class AllreduceMode:
    """A replica per device, gradients averaged by an allreduce (see the module doc)."""

    name: ClassVar[str] = "allreduce"

    def check(self, spec: ModelSpec, workers: int) -> None:
        """Any model; at least one worker (the central node coordinates, it holds no shard)."""
        from edgeagent.errors import PlanningError

        if workers < 1:
            raise PlanningError("--mode allreduce trains on the workers: start at least one (--workers)")

    def start(self, central: Central, data: Dataset, spec: ModelSpec, devices: list[str]) -> AllreduceRun:
        from edgeagent.allreduce.codec import gradient_bits
        from edgeagent.modes.allreduce.central import AllreduceRun

        gradient_bits(central.config.compression)  # a ConfigError before any device is assigned
        return AllreduceRun(central, data, spec, devices)

    def worker_session(self, worker: Worker, assign: Assign) -> WorkerSession | None:
        from edgeagent.modes.allreduce.worker import AllreduceSession

        return AllreduceSession.open(worker, assign)


__all__ = ["AllreduceMode"]
