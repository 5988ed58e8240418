"""One run of the pipeline mode (and of the hybrid mode) on the central node, built by composition.

The run is its state (:class:`~.context.RunState`) and ten parts, each in its own module and each
holding the state and the parts below it: nothing reaches up, so a part can be read (and tested) with
only what it names. From the bottom:

=============  ===========================================================================================
part           what it does
=============  ===========================================================================================
setup          assignments, the stage's subscriptions, readiness barriers, link measurements (Sec. III-B)
estimation     the latency predictor's state: every device's ``h``, drift, the adaptive update (AccEPT)
planning       the DP's problem, the first split, the re-split job, bit widths per link (Sec. III-D)
liveness       faults detected, every deadline from the measured step (Sec. III-F)
checkpoints    replication rounds, checkpoints at global replication points, collecting the model
handling       one handler per message type: records what arrived for the waits
switching      moving to a new split: fetches, commit barrier, joiners (Algorithm 1)
evaluation     the test set streamed through the pipeline at every epoch's end
recovery       probe, recovery case, survivors' split, rollback (Sec. III-F)
trainer        the training loop: stage 0 under 1F1B, re-splits, evaluation, recovery (Sec. III-C)
=============  ===========================================================================================

The hybrid mode (a stage held by several devices) is the same run with five parts swapped for their
hybrid variants (:mod:`.hybrid`) and one more, the measured feedback on re-splits
(:mod:`.hybrid_feedback`): :class:`HybridRun` only chooses other parts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edgeagent.modes.pipeline.central.checkpoint import Checkpoints
from edgeagent.modes.pipeline.central.context import RunState
from edgeagent.modes.pipeline.central.estimation import Estimation
from edgeagent.modes.pipeline.central.evaluation import Evaluation
from edgeagent.modes.pipeline.central.handlers import Handlers
from edgeagent.modes.pipeline.central.hybrid import (
    HybridHandlers,
    HybridLiveness,
    HybridPlanning,
    HybridSwitching,
    HybridTrainer,
)
from edgeagent.modes.pipeline.central.hybrid_feedback import Feedback
from edgeagent.modes.pipeline.central.hybrid_first import FirstStage
from edgeagent.modes.pipeline.central.liveness import Liveness
from edgeagent.modes.pipeline.central.planning import Planning
from edgeagent.modes.pipeline.central.recovery import Recovery
from edgeagent.modes.pipeline.central.setup import Setup
from edgeagent.modes.pipeline.central.switching import Switching
from edgeagent.modes.pipeline.central.trainer import Trainer

if TYPE_CHECKING:
    import torch

    from edgeagent.config import CentralConfig
    from edgeagent.data import Dataset
    from edgeagent.models import ModelSpec
    from edgeagent.protocol.identity import PlanView
    from edgeagent.protocol.messages import Message
    from edgeagent.roles.central.node import Central
    from edgeagent.roles.central.report import RunReport
    from edgeagent.runtime.role import Inbound


class PipelineRun:
    """One run of the pipeline mode on the central node: :meth:`execute` returns its report. What the
    node uses of it (:class:`~edgeagent.roles.mode.CentralRun`) is here; the rest is the parts'."""

    MODE = "pipeline"  # what the assignments name (Assign.mode): the worker half of this run

    def __init__(
        self,
        node: Central,
        config: CentralConfig,
        data: Dataset,
        spec: ModelSpec,
        worker_list: list[str],
        *,
        resume: dict[str, Any] | None = None,
    ) -> None:
        self.state = RunState(node, config, data, spec, worker_list, resume=resume, mode=self.MODE)
        self._build_parts(self.state)
        # The first split reads the predictor's times (AccEPT: every device's h), so they come first.
        self.state.device_times = self.estimation.load_device_times()
        self.state.begin(self.planning.initial_points())

    def _build_parts(self, state: RunState) -> None:
        self.setup = Setup(state)
        self.estimation = Estimation(state)
        self.planning = Planning(state, self.estimation)
        self.liveness = Liveness(state, self.estimation, self.planning)
        self.checkpoints = Checkpoints(state, self.liveness)
        self.handling = Handlers(state, self.estimation, self.checkpoints)
        self.switching = Switching(state, self.setup, self.planning, self.liveness)
        self.evaluation = Evaluation(state, self.planning, self.liveness)
        self.recovery = Recovery(state, self.setup, self.planning, self.liveness, self.switching)
        self.trainer = Trainer(
            state,
            self.setup,
            self.planning,
            self.liveness,
            self.checkpoints,
            self.switching,
            self.evaluation,
            self.recovery,
        )

    # -- what the central node uses (roles/mode.py: CentralRun) -----------------------------------

    @property
    def worker_list(self) -> list[str]:
        return self.state.worker_list

    def plan_view(self) -> PlanView:
        """Who holds each stage now: stage outputs are taken only from them (protocol/identity.py)."""
        return self.state.plan_view()

    def execute(self) -> RunReport:
        """Build the workers' stages, measure the links, then train to the end (Sec. III-B, III-C)."""
        return self.trainer.execute()

    def handlers(self) -> dict[type[Message], Callable[[Inbound], None]]:
        return self.handling.handlers()

    def metrics(self) -> dict[str, Any] | None:
        return self.trainer.metrics()

    def stage_time_pairs(self) -> dict[str, dict[str, float]]:
        return self.estimation.stage_time_pairs()

    def collect_weights(self) -> dict[str, torch.Tensor]:
        return self.checkpoints.collect_weights()

    def checkpoint_newest(self) -> int | None:
        return self.checkpoints.checkpoint_newest()

    def save_model(self, path: str) -> bool:
        return self.checkpoints.save_model(path)


class HybridRun(PipelineRun):
    """One run of the hybrid mode on the central node: the pipeline run with its hybrid parts
    (:mod:`.hybrid`), where a stage may be held by several devices."""

    MODE = "hybrid"

    def _build_parts(self, state: RunState) -> None:
        self.feedback = Feedback(state)
        self.setup = setup = Setup(state)
        self.estimation = estimation = Estimation(state)
        self.planning = planning = HybridPlanning(state, self.feedback, estimation)
        self.liveness = liveness = HybridLiveness(state, self.feedback, setup, estimation, planning)
        self.checkpoints = checkpoints = Checkpoints(state, liveness)
        self.first = first = FirstStage(state)
        liveness.first = first
        self.handling = handling = HybridHandlers(state, estimation, planning, checkpoints, first)
        self.switching = switching = HybridSwitching(
            state, self.feedback, setup, planning, liveness, handling
        )
        self.evaluation = evaluation = Evaluation(state, planning, liveness)
        self.recovery = recovery = Recovery(state, setup, planning, liveness, switching)
        self.trainer = HybridTrainer(
            state,
            self.feedback,
            setup,
            estimation,
            planning,
            liveness,
            checkpoints,
            switching,
            evaluation,
            recovery,
            first,
        )


__all__ = ["HybridRun", "PipelineRun"]
