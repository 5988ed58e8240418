"""Checkpoints of the pipeline run (at global replication points) and collecting the trained model; the
files themselves are :mod:`.checkpoint_file`'s."""

from __future__ import annotations

import logging
from typing import Any

import torch

from edgeagent.models import num_layers
from edgeagent.modes.pipeline.central.context import RunState
from edgeagent.protocol.commands import Collect
from edgeagent.protocol.messages import Weights
from edgeagent.protocol.topics import Family
from edgeagent.roles.central.checkpoint_file import save_model

log = logging.getLogger("edgeagent.roles.central")

_HISTORY = ("test_accuracy_per_epoch", "test_loss_per_epoch", "train_loss_per_epoch")


class Checkpoints(RunState):
    """Replication rounds seen complete, checkpoints written from them, the trained model collected."""

    def _barrier(self, nbytes: float) -> float:  # liveness.Liveness gives the real one
        raise NotImplementedError

    def _replicated(self, msg: Weights) -> None:
        """Tell monitors when a replication round is complete (all global replicas, or the last chain one)."""
        held = self.store.holdings()
        if msg.purpose == "global" and all(msg.version in held.get(d, []) for d in self.worker_list[1:]):
            self.event("replication", kind="global", version=msg.version, devices=self.worker_list[1:])
        elif msg.purpose == "chain" and msg.device_id == self.worker_list[-1]:
            self.event("replication", kind="chain", version=msg.version, device=msg.device_id)

    def _maybe_checkpoint(self, version: int) -> None:
        """At a global replication point, once every stage's replica of it is in, write a checkpoint: called
        when a worker's global replica arrives and when stage 0 takes its own snapshot, since either can
        come last (the workers finish a batch's backward pass before stage 0 commits it: checking on the
        replicas alone lost two to three of every seven checkpoints, and on a busy machine all but one).
        A version is tried once (a replica delivered twice, or a disk that refused it, does not write it
        again: the next point may fit)."""
        if not self.node.checkpointing or not self.config.global_every or version % self.config.global_every:
            return
        if version <= self.checkpointed:
            return
        held = self.store.holdings()
        if not all(version in held.get(d, []) for d in self.worker_list):
            return
        self.checkpointed = version
        self.node.save_checkpoint(version, self._checkpoint_state(version), f"of version {version}")

    def checkpoint_newest(self) -> int | None:
        """On SIGTERM: the newest version whose snapshot every stage's is in (the latest global replication
        point, or the start of the current split), written unless the run has it on disk already; the
        version of the run's newest checkpoint then (None: none). Nothing is asked of the workers: the
        state of a replication point is what exists without draining the pipeline, which systemd's stop
        timeout would not wait for on a slow Pi."""
        held = self.store.holdings()
        common = set(held.get(self.worker_list[0], []))
        for device in self.worker_list[1:]:
            common &= set(held.get(device, []))
        runs = self.node.runs
        newest = runs.newest(self.run_id) if runs is not None else None
        if not common or max(common) <= (newest if newest is not None else -1):
            return newest
        version = max(common)
        self.checkpointed = max(self.checkpointed, version)
        written = self.node.save_checkpoint(version, self._checkpoint_state(version), f"of version {version}")
        return version if written else newest

    def _checkpoint_state(self, version: int) -> dict[str, Any]:
        """The whole model at ``version`` from every stage's snapshot, with what a resumed run needs."""
        weights: dict[str, torch.Tensor] = {}
        momentum: dict[str, torch.Tensor] = {}
        for device in self.worker_list:
            snap = self.store.snapshots[device][version]
            weights.update(snap.weights)
            momentum.update(snap.momentum)
        return {
            "run_id": self.run_id,
            "version": version,
            "points": list(self.points),
            "worker_list": list(self.worker_list),
            "weights": weights,
            "momentum": momentum,
            "config": self.config.model_dump_json(),
            "plan_id": self.plan_id,
            "history": {key: list(getattr(self.report, key)) for key in _HISTORY},
        }

    def collect_weights(self) -> dict[str, torch.Tensor]:
        """The whole model's state, gathered from every stage (keys ``<layer>.<name>``)."""
        self.inbox.weights.clear()
        if len(self.worker_list) > 1:
            self.send(self.topics.fixed(Family.COMMAND), Collect(run_id=self.run_id))
        # The workers' weights cross their links (a device's uplink may be the slowest measured one).
        others = sum(self.param_bytes) - sum(self.param_bytes[self.points[0] : self.points[1]])
        self.node.wait_until(
            lambda: len(self.inbox.weights) >= len(self.worker_list) - 1,
            self._barrier(others),
            lambda: (
                f"workers {sorted(set(self.worker_list[1:]) - set(self.inbox.weights))} did not send "
                "their weights"
            ),
        )
        state: dict[str, torch.Tensor] = {}
        for part in [self.stage.state(), *(w.tensors for w in self.inbox.weights.values())]:
            for key, value in part.items():
                state[key.removeprefix("layers.")] = value
        return state

    def save_model(self, path: str) -> bool:
        weights, what = self.collect_weights(), f"{num_layers(self.spec)} layers"
        return save_model(path, weights, what, spec=self.spec, run_id=self.run_id, train=self.train)
