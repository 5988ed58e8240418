"""FTPipeHD's asynchronous pipeline (papers/000) as a training mode: the default, ``--mode pipeline``.

The worker's half is :class:`~edgeagent.roles.worker.session.PipelineSession`. The central node still
drives the pipeline itself (:mod:`edgeagent.roles.central`); its half moves behind :meth:`check` and
:meth:`run` separately. Both halves are imported when first used: the registry
(:mod:`edgeagent.modes`) stays free of torch and of the roles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from edgeagent.data import Dataset
    from edgeagent.models import ModelSpec
    from edgeagent.modes.base import WorkerSession
    from edgeagent.protocol.messages import Assign
    from edgeagent.roles.central import Central, RunReport
    from edgeagent.roles.worker import Worker


class PipelineMode:
    """One stage per device, 1F1B, replication and re-partitioning (see the module doc)."""

    name: ClassVar[str] = "pipeline"

    def check(self, spec: ModelSpec, workers: int) -> None:
        raise NotImplementedError("the central node checks the pipeline's model itself")

    def run(self, central: Central, data: Dataset, spec: ModelSpec) -> RunReport:
        raise NotImplementedError("the central node drives the pipeline itself")

    def worker_session(self, worker: Worker, assign: Assign) -> WorkerSession | None:
        from edgeagent.roles.worker.session import PipelineSession

        return PipelineSession.open(worker, assign)


__all__ = ["PipelineMode"]
