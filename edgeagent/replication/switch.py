"""One device's part in a re-partition or a recovery (papers/000 Sec. III-D, III-F, Algorithm 1).

Note: the protocol of a switch.
    1. The central node drains the pipeline (re-partition) or stops it (recovery).
    2. It sends ``Repartition`` (old and new points and worker lists) to every worker. For a recovery
       it adds the version every stage rolls back to and ``sources``: which device serves each old
       stage's weights at that version (the stage itself, its chain successor, or the central node's
       global replica).
    3. Each device works out from the two splits which of its new layers it can take from its own
       store and which it must fetch (``redistribution_plan``: Algorithm 1 at device level), asks the
       serving devices with ``FetchRequest`` on its own request topic and collects their ``Weights``
       (with the momentum buffers) from their replica topics.
    4. When it has everything it says ``Ready(phase="fetched")``. Only when every device has, the
       central node broadcasts ``Commit``: before it, nobody may drop what others still fetch.
    5. On the commit each device builds its new stage and says ``Ready(phase="built")``; then the
       central node resumes with the new plan id, and messages of older plans are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec
from edgeagent.pipeline.build import make_stage
from edgeagent.pipeline.stage import Stage
from edgeagent.planner.partition import stage_of_layer
from edgeagent.planner.redistribute import DevicePlan, redistribution_plan
from edgeagent.protocol.messages import FetchRequest, Repartition, Weights
from edgeagent.protocol.options import TrainOptions
from edgeagent.replication.store import WeightStore, layer_of


@dataclass
class Switch:
    device_id: str
    order: Repartition
    plan: DevicePlan
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    pending: dict[tuple[str, str], set[int]] = field(default_factory=dict)  # (holder, whose) -> layers

    @property
    def version(self) -> int:
        """Where weights come from: -1 (live) for a re-partition, the rollback version for a recovery."""
        return self.order.version if self.order.recovery else -1

    @classmethod
    def start(
        cls,
        device_id: str,
        order: Repartition,
        store: WeightStore,
        live: Stage | None,
        spec: ModelSpec,
        seed: int,
    ) -> Switch | None:
        """``None`` when this device has no stage in the new split."""
        owners = order.previous_workers
        sources = order.sources or owners
        plans = redistribution_plan(
            order.previous_points, order.points, sources, order.worker_list, alive=set(sources)
        )
        plan = plans.get(device_id)
        fetch: dict[str, list[int]] = {h: list(v) for h, v in plan.fetch.items()} if plan else {}
        local = list(plan.local) if plan is not None else []
        if plan is None:
            # Hybrid stages: a helper of new stage k takes the layers its primary ends up with: those the
            # primary holds itself from the primary, the others from where the primary gets them.
            k = next((k for k, g in enumerate(order.groups) if device_id in g[1:]), None)
            primary_plan = plans.get(order.worker_list[k]) if k is not None else None
            if primary_plan is None:
                return None
            fetch = {holder: list(layers) for holder, layers in primary_plan.fetch.items()}
            if primary_plan.local:
                fetch.setdefault(order.worker_list[primary_plan.stage], []).extend(primary_plan.local)
            local = [layer for holder, layers in fetch.items() if holder == device_id for layer in layers]
            fetch = {holder: layers for holder, layers in fetch.items() if holder != device_id}
            plan = DevicePlan(
                device_id,
                primary_plan.stage,
                primary_plan.start,
                primary_plan.end,
                tuple(sorted(local)),
                {holder: tuple(sorted(layers)) for holder, layers in fetch.items()},
            )
        switch = cls(device_id, order, plan)
        own: dict[str, list[int]] = {}
        for layer in local:
            own.setdefault(owners[stage_of_layer(order.previous_points, layer)], []).append(layer)
        for holder, layers in fetch.items():
            for layer in layers:
                whose = owners[stage_of_layer(order.previous_points, layer)]
                switch.pending.setdefault((holder, whose), set()).add(layer)
        for whose, mine in own.items():
            weights, momentum = store.get(whose, switch.version, mine, live=live, spec=spec, seed=seed)
            switch.weights.update(weights)
            switch.momentum.update(momentum)
        return switch

    @property
    def plan_id(self) -> int:
        return self.order.plan_id

    @property
    def complete(self) -> bool:
        return not self.pending

    @property
    def holders(self) -> set[str]:
        return {holder for holder, _ in self.pending}

    def requests(self) -> list[FetchRequest]:
        return [
            FetchRequest(
                run_id=self.order.run_id,
                plan_id=self.plan_id,
                requester=self.device_id,
                owner=holder,
                layers=sorted(layers),
                version=self.version,
                of_device=whose,
            )
            for (holder, whose), layers in self.pending.items()
        ]

    def accept(self, msg: Weights) -> bool:
        """Take the layers a holder sent; return whether they belonged to this switch."""
        key = (msg.device_id, msg.of_device or msg.device_id)
        if msg.plan_id != self.plan_id or msg.recipient != self.device_id or key not in self.pending:
            return False
        wanted = self.pending[key]
        got = set(msg.layers) | {layer_of(k) for k in msg.tensors}
        if not wanted <= got:
            raise TrainingError(
                f"{msg.device_id} sent layers {sorted(got)}, {self.device_id} asked for {sorted(wanted)}"
            )
        self.weights.update({k: v for k, v in msg.tensors.items() if layer_of(k) in wanted})
        self.momentum.update({k: v for k, v in msg.optimizer.items() if layer_of(k) in wanted})
        del self.pending[key]
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
            options=options,
            weights=self.weights,
            momentum_buffers=self.momentum,
            version=self.order.version,
            in_flight=self.order.in_flight,
            replicated=bool(self.order.groups) and len(self.order.groups[plan.stage]) > 1,
        )


def serve_fetch(
    store: WeightStore, live: Stage | None, request: FetchRequest, spec: ModelSpec, seed: int, run_id: str
) -> Weights:
    """A holder's answer to a fetch request: live weights, a snapshot, a replica or the seeded start."""
    whose = request.of_device or store.device_id
    weights, momentum = store.get(whose, request.version, request.layers, live=live, spec=spec, seed=seed)
    return Weights(
        run_id=run_id,
        device_id=store.device_id,
        stage=-1,
        start=min(request.layers),
        end=max(request.layers) + 1,
        version=request.version,
        tensors=weights,
        purpose="redistribute",
        optimizer=momentum,
        plan_id=request.plan_id,
        recipient=request.requester,
        layers=list(request.layers),
        of_device=whose,
    )
