"""FTPipeHD's asynchronous pipeline (papers/000) as a training mode: the default, ``--mode pipeline``.

The central node's half is :class:`~edgeagent.modes.pipeline.central.run.PipelineRun` (the package
:mod:`edgeagent.roles.central`), the worker's half
:class:`~edgeagent.modes.pipeline.worker.session.PipelineSession`; both move data through
:class:`~edgeagent.pipeline.runner.StageRunner`. Both halves are imported when first used: the registry
(:mod:`edgeagent.modes`) stays free of torch and of the roles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from edgeagent.data import Dataset
    from edgeagent.models import ModelSpec
    from edgeagent.modes.pipeline.central.run import PipelineRun
    from edgeagent.protocol.messages import Assign
    from edgeagent.roles.central import Central
    from edgeagent.roles.mode import WorkerSession
    from edgeagent.roles.worker import Worker


class PipelineMode:
    """One stage per device, 1F1B, replication and re-partitioning (see the module doc)."""

    name: ClassVar[str] = "pipeline"

    def check(self, spec: ModelSpec, workers: int) -> None:
        """One stage per device: the model needs at least as many layers as devices."""
        from edgeagent.errors import PlanningError
        from edgeagent.models import num_layers

        layers = num_layers(spec)
        if workers + 1 > layers:
            raise PlanningError(
                f"model {spec.name!r} has {layers} layers: it cannot be split over the central node and "
                f"{workers} workers (at most {layers - 1}); start fewer workers "
                "(--workers), pick a deeper model (--model, --model-option) or let a stage have several "
                "devices (--mode hybrid)"
            )

    def _run_class(self) -> type[PipelineRun]:
        from edgeagent.modes.pipeline.central.run import PipelineRun

        return PipelineRun

    def start(self, central: Central, data: Dataset, spec: ModelSpec, devices: list[str]) -> PipelineRun:
        return self._run_class()(central, central.config, data, spec, devices, resume=central.resume)

    def worker_session(self, worker: Worker, assign: Assign) -> WorkerSession | None:
        from edgeagent.modes.pipeline.worker.session import PipelineSession

        return PipelineSession.open(worker, assign)


__all__ = ["PipelineMode"]
