"""Weight replicas (papers/000 Sec. III-E): a device's own snapshots and the replicas it holds for others.

Every stage snapshots its weights and momentum when the batch at a replication point finishes its
backward pass (version = batches done), keeps the latest few, and sends a copy to its chain
successor(s) and, at global points, to the central node. Because every stage snapshots after the same
batch, snapshots of one version form a consistent model: a rollback takes every stage back to one
version and replays the batches after it, so no update is lost or applied twice. Without a rollback
only a dead stage goes back to its snapshot and is brought forward to the others' version
(pipeline/catchup.py); the central node then keeps it here as that device's snapshot of that version.

Version 0 is the seeded initial model, which any device can rebuild from the spec without a replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec, build_layers
from edgeagent.pipeline.stage import Stage, StageModule
from edgeagent.protocol.messages import Weights, WeightsPurpose

Tensors = dict[str, torch.Tensor]


def checksum(tensors: Tensors) -> str:
    """SHA-256 over names, shapes, dtypes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        digest.update(t.numpy().tobytes() if t.dtype != torch.bool else t.to(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def snapshots_kept(replica_share: float) -> int:
    """Snapshots a store keeps per device: 3; 6 when replicas are paced (``replica_share`` > 0): a paced
    replica may wait and give way to a newer one, so the versions others hold lag further behind, and a
    recovery needs one version that every stage can serve (its own snapshot or a replica of it)."""
    return 6 if replica_share > 0 else 3


def layer_of(key: str) -> int:
    """``layers.<j>.<name>`` -> j."""
    return int(key.split(".")[1])


@dataclass(frozen=True)
class Snapshot:
    version: int
    start: int
    end: int
    weights: Tensors
    momentum: Tensors

    def select(self, layers: Iterable[int]) -> tuple[Tensors, Tensors]:
        wanted = set(layers)
        outside = sorted(j for j in wanted if not self.start <= j < self.end)
        if outside:
            raise TrainingError(f"layers {outside} are not in the snapshot [{self.start}, {self.end})")
        return (
            {k: v for k, v in self.weights.items() if layer_of(k) in wanted},
            {k: v for k, v in self.momentum.items() if layer_of(k) in wanted},
        )


class WeightStore:
    """What one device can serve: its live stage, its own snapshots, replicas of others, version 0."""

    def __init__(self, device_id: str, keep: int = 3) -> None:
        self.device_id = device_id
        self.keep = keep
        self.snapshots: dict[str, dict[int, Snapshot]] = {}

    def clear(self) -> None:
        self.snapshots.clear()

    def _put(self, device: str, snap: Snapshot) -> None:
        versions = self.snapshots.setdefault(device, {})
        versions[snap.version] = snap
        for old in sorted(versions)[: -self.keep]:
            del versions[old]

    def put(self, device: str, snap: Snapshot) -> None:
        """Keep a snapshot of ``device`` made here (a dead stage brought forward without a rollback)."""
        self._put(device, snap)

    def snapshot(self, stage: Stage) -> Snapshot:
        """Keep this device's own weights and momentum at the stage's current version."""
        layers = range(stage.module.start, stage.module.end)
        weights, momentum = stage.export(layers)
        snap = Snapshot(stage.version, stage.module.start, stage.module.end, weights, momentum)
        self._put(self.device_id, snap)
        return snap

    def add_replica(self, msg: Weights) -> None:
        """Store another device's replica; raise :class:`TrainingError` if it does not verify."""
        if msg.checksum != checksum(msg.tensors):
            raise TrainingError(
                f"replica of {msg.device_id} version {msg.version} failed its checksum; ignored"
            )
        self._put(
            msg.of_device or msg.device_id,
            Snapshot(msg.version, msg.start, msg.end, dict(msg.tensors), dict(msg.optimizer)),
        )

    def drop_after(self, version: int) -> None:
        """Forget snapshots newer than ``version`` (after a rollback they belong to a timeline that ended)."""
        for versions in self.snapshots.values():
            for v in [v for v in versions if v > version]:
                del versions[v]

    def holdings(self) -> dict[str, list[int]]:
        return {device: sorted(versions) for device, versions in self.snapshots.items()}

    def get(
        self,
        of_device: str,
        version: int,
        layers: list[int],
        *,
        live: Stage | None,
        spec: ModelSpec,
        seed: int,
    ) -> tuple[Tensors, Tensors]:
        """Weights and momentum of ``layers`` of ``of_device`` at ``version`` (-1: live; the live stage's own
        version: live too, the same weights as its snapshot would hold; 0 without a snapshot of it: the
        seeded start)."""
        if version == -1 or (live is not None and of_device == self.device_id and version == live.version):
            if live is None or of_device != self.device_id:
                raise TrainingError(f"{self.device_id} has no live weights of {of_device}")
            return live.export(layers)
        snap = self.snapshots.get(of_device, {}).get(version)
        if version == 0 and snap is None:
            return seeded(spec, seed, layers), {}
        if snap is None:
            raise TrainingError(
                f"{self.device_id} holds no version {version} of {of_device} "
                f"(holds {self.holdings().get(of_device, [])})"
            )
        return snap.select(layers)


def seeded(spec: ModelSpec, seed: int, layers: Iterable[int]) -> Tensors:
    """The initial weights of some layers, rebuilt from the spec (the same on every device)."""
    out: Tensors = {}
    for j in layers:
        (layer,) = build_layers(spec, j, j + 1, seed=seed)
        out.update(StageModule({j: layer}).state_dict())
    return out


def replica_message(
    run_id: str, device_id: str, stage_index: int, snap: Snapshot, purpose: WeightsPurpose, plan_id: int
) -> Weights:
    return Weights(
        run_id=run_id,
        device_id=device_id,
        stage=stage_index,
        start=snap.start,
        end=snap.end,
        version=snap.version,
        tensors=snap.weights,
        purpose=purpose,
        optimizer=snap.momentum,
        layers=list(range(snap.start, snap.end)),
        of_device=device_id,
        checksum=checksum(snap.weights),
        plan_id=plan_id,
    )
