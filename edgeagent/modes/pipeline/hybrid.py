"""Hybrid stages (``--mode hybrid``): FTPipeHD's pipeline where a stage may be held by several devices.

The idea of Asteroid (MobiCom 2024) and of PipeDream's replicated stages: the planner
(:mod:`edgeagent.planner.hybrid`) decides how many devices each stage gets and may leave a device out;
a replicated stage splits every batch's rows among its devices in proportion to their speed, and its
devices add up their parameter gradients before every update, so the pipeline's weight stashing and
vertical sync stay exact. When a device of a replicated stage dies, the others take its rows from the
next batch on: no rollback, no layers moved. With one device per stage it is the pipeline mode.

The central node's half is :class:`~edgeagent.modes.pipeline.central.run.HybridRun`, the worker's
:class:`~edgeagent.modes.pipeline.worker.hybrid.HybridSession`; both are imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from edgeagent.modes.pipeline import PipelineMode

if TYPE_CHECKING:
    from edgeagent.models import ModelSpec
    from edgeagent.modes.pipeline.central.run import PipelineRun
    from edgeagent.protocol.messages import Assign
    from edgeagent.roles.mode import WorkerSession
    from edgeagent.roles.worker import Worker


class HybridMode(PipelineMode):
    """Stages held by groups of devices (see the module doc)."""

    name: ClassVar[str] = "hybrid"

    def check(self, spec: ModelSpec, workers: int) -> None:
        """Any number of workers: a stage may have several devices, and the planner may leave some out."""
        from edgeagent.errors import PlanningError
        from edgeagent.models import num_layers

        if workers and num_layers(spec) < 2:
            raise PlanningError(
                f"model {spec.name!r} has 1 layer: the central node holds it, no worker can help; "
                "pick a deeper model (--model, --model-option) or train without workers"
            )

    def _run_class(self) -> type[PipelineRun]:
        from edgeagent.modes.pipeline.central.run import HybridRun

        return HybridRun

    def worker_session(self, worker: Worker, assign: Assign) -> WorkerSession | None:
        from edgeagent.modes.pipeline.worker.hybrid import HybridSession

        return HybridSession.open(worker, assign)


__all__ = ["HybridMode"]
