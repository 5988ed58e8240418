"""One device's part in a re-partition (papers/000 Sec. III-D): keep, fetch, wait for the commit, build.

Note: the protocol of a switch.
    1. The central node drains the pipeline, so every stage holds the weights of the same version.
    2. It sends ``Repartition`` (old and new points and worker lists) to every worker.
    3. Each device works out from the two splits which of its new layers it already has and which it
       must fetch from their current owner (``redistribution_plan``), asks those owners with
       ``FetchRequest`` on its own request topic and collects the owners' ``Weights`` (with the
       momentum buffers) from their replica topics. Owners answer from their *current* stage.
    4. When it has everything it says ``Ready(phase="fetched")``. Only when every device has, the
       central node broadcasts ``Commit``: before it, nobody may drop the layers others still fetch.
    5. On the commit each device builds its new stage and says ``Ready(phase="built")``; then the
       central node resumes with the new plan id, and messages of the old plan are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec
from edgeagent.pipeline.build import make_stage
from edgeagent.pipeline.stage import Stage
from edgeagent.planner.redistribute import DevicePlan, redistribution_plan
from edgeagent.protocol.messages import FetchRequest, Repartition, Weights


@dataclass(frozen=True)
class TrainOptions:
    """What every stage of a run shares for building its optimizer."""

    learning_rate: float
    momentum: float
    weight_decay: float
    aggregation: bool
    aggregation_interval: int


@dataclass
class Switch:
    device_id: str
    order: Repartition
    plan: DevicePlan
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    pending: dict[str, set[int]] = field(default_factory=dict)

    @classmethod
    def start(cls, device_id: str, order: Repartition, current: Stage | None) -> Switch | None:
        """``None`` when this device has no stage in the new split."""
        plans = redistribution_plan(
            order.previous_points, order.points, order.previous_workers, order.worker_list
        )
        plan = plans.get(device_id)
        if plan is None:
            return None
        switch = cls(device_id, order, plan)
        if plan.local:
            if current is None:
                raise TrainingError(f"{device_id} should hold layers {list(plan.local)} but has no stage")
            switch.weights, switch.momentum = current.export(plan.local)
        switch.pending = {owner: set(layers) for owner, layers in plan.fetch.items() if layers}
        return switch

    @property
    def plan_id(self) -> int:
        return self.order.plan_id

    @property
    def complete(self) -> bool:
        return not self.pending

    def requests(self) -> list[FetchRequest]:
        return [
            FetchRequest(
                run_id=self.order.run_id,
                plan_id=self.plan_id,
                requester=self.device_id,
                owner=owner,
                layers=sorted(layers),
            )
            for owner, layers in self.pending.items()
        ]

    def accept(self, msg: Weights) -> bool:
        """Take the layers an owner sent; return whether they belonged to this switch."""
        if (
            msg.plan_id != self.plan_id
            or msg.recipient != self.device_id
            or msg.device_id not in self.pending
        ):
            return False
        wanted = self.pending[msg.device_id]
        got = set(msg.layers) | {int(k.split(".")[1]) for k in msg.tensors}
        if not wanted <= got:
            raise TrainingError(
                f"{msg.device_id} sent layers {sorted(got)}, {self.device_id} asked for {sorted(wanted)}"
            )
        self.weights.update({k: v for k, v in msg.tensors.items() if int(k.split(".")[1]) in wanted})
        self.momentum.update({k: v for k, v in msg.optimizer.items() if int(k.split(".")[1]) in wanted})
        del self.pending[msg.device_id]
        return True

    def build(self, spec: ModelSpec, seed: int, options: TrainOptions) -> Stage:
        plan = self.plan
        return make_stage(
            spec,
            seed=seed,
            start=plan.start,
            end=plan.end,
            index=plan.stage,
            num_stages=len(self.order.points) - 1,
            learning_rate=options.learning_rate,
            momentum=options.momentum,
            weight_decay=options.weight_decay,
            aggregation=options.aggregation,
            aggregation_interval=options.aggregation_interval,
            weights=self.weights,
            momentum_buffers=self.momentum,
            version=self.order.version,
        )


def serve_fetch(stage: Stage | None, request: FetchRequest, owner: str, run_id: str) -> Weights:
    """The owner's answer to a fetch request, from its current (pre-commit) stage."""
    if stage is None:
        raise TrainingError(f"{owner} has no stage to send layers {request.layers} from")
    weights, momentum = stage.export(request.layers)
    return Weights(
        run_id=run_id,
        device_id=owner,
        stage=-1,
        start=min(request.layers),
        end=max(request.layers) + 1,
        version=stage.version,
        tensors=weights,
        purpose="redistribute",
        optimizer=momentum,
        plan_id=request.plan_id,
        recipient=request.requester,
        layers=list(request.layers),
    )
