"""Checkpoints of the pipeline run (at global replication points) and collecting the trained model; the
files themselves are :mod:`.checkpoint_file`'s."""

from __future__ import annotations

import logging
from typing import Any

import torch

from edgeagent.models import num_layers
from edgeagent.modes.pipeline.central.context import RunState
from edgeagent.modes.pipeline.central.liveness import Liveness
from edgeagent.protocol.commands import Collect
from edgeagent.protocol.messages import Weights
from edgeagent.protocol.topics import Family
from edgeagent.roles.central.checkpoint_file import save_model

log = logging.getLogger("edgeagent.roles.central")

_HISTORY = ("test_accuracy_per_epoch", "test_loss_per_epoch", "train_loss_per_epoch")


class Checkpoints:
    """Replication rounds seen complete, checkpoints written from them, the trained model collected."""

    def __init__(self, state: RunState, liveness: Liveness) -> None:
        self.state = state
        self.liveness = liveness

    def replicated(self, msg: Weights) -> None:
        """Tell monitors when a replication round is complete (all global replicas, or the last chain one)."""
        state = self.state
        held = state.store.holdings()
        if msg.purpose == "global" and all(msg.version in held.get(d, []) for d in state.worker_list[1:]):
            state.event("replication", kind="global", version=msg.version, devices=state.worker_list[1:])
        elif msg.purpose == "chain" and msg.device_id == state.worker_list[-1]:
            state.event("replication", kind="chain", version=msg.version, device=msg.device_id)

    def maybe_checkpoint(self, version: int) -> None:
        """At a global replication point, once every stage's replica of it is in, write a checkpoint: called
        when a worker's global replica arrives and when stage 0 takes its own snapshot, since either can
        come last (the workers finish a batch's backward pass before stage 0 commits it: checking on the
        replicas alone lost two to three of every seven checkpoints, and on a busy machine all but one).
        A version is tried once (a replica delivered twice, or a disk that refused it, does not write it
        again: the next point may fit)."""
        state = self.state
        if (
            not state.node.checkpointing
            or not state.config.global_every
            or version % state.config.global_every
        ):
            return
        if version <= state.checkpointed:
            return
        held = state.store.holdings()
        if not all(version in held.get(d, []) for d in state.worker_list):
            return
        state.checkpointed = version
        state.node.save_checkpoint(version, self._checkpoint_state(version), f"of version {version}")

    def checkpoint_newest(self) -> int | None:
        """On SIGTERM: the newest version whose snapshot every stage's is in (the latest global replication
        point, or the start of the current split), written unless the run has it on disk already; the
        version of the run's newest checkpoint then (None: none). Nothing is asked of the workers: the
        state of a replication point is what exists without draining the pipeline, which systemd's stop
        timeout would not wait for on a slow Pi."""
        state = self.state
        held = state.store.holdings()
        common = set(held.get(state.worker_list[0], []))
        for device in state.worker_list[1:]:
            common &= set(held.get(device, []))
        runs = state.node.runs
        newest = runs.newest(state.run_id) if runs is not None else None
        if not common or max(common) <= (newest if newest is not None else -1):
            return newest
        version = max(common)
        state.checkpointed = max(state.checkpointed, version)
        written = state.node.save_checkpoint(
            version, self._checkpoint_state(version), f"of version {version}"
        )
        return version if written else newest

    def _checkpoint_state(self, version: int) -> dict[str, Any]:
        """The whole model at ``version`` from every stage's snapshot, with what a resumed run needs."""
        state = self.state
        weights: dict[str, torch.Tensor] = {}
        momentum: dict[str, torch.Tensor] = {}
        for device in state.worker_list:
            snap = state.store.snapshots[device][version]
            weights.update(snap.weights)
            momentum.update(snap.momentum)
        return {
            "run_id": state.run_id,
            "version": version,
            "points": list(state.points),
            "worker_list": list(state.worker_list),
            "weights": weights,
            "momentum": momentum,
            "config": state.config.model_dump_json(),
            "plan_id": state.plan_id,
            "history": {key: list(getattr(state.report, key)) for key in _HISTORY},
        }

    def collect_weights(self) -> dict[str, torch.Tensor]:
        """The whole model's state, gathered from every stage (keys ``<layer>.<name>``)."""
        run = self.state
        run.inbox.weights.clear()
        if len(run.worker_list) > 1:
            run.send(run.topics.fixed(Family.COMMAND), Collect(run_id=run.run_id))
        # The workers' weights cross their links (a device's uplink may be the slowest measured one).
        others = sum(run.param_bytes) - sum(run.param_bytes[run.points[0] : run.points[1]])
        # Every stage's primary: a hybrid stage's helpers answer too, with a copy of their stage (stage 0's
        # helpers as well), and are not waited for nor taken.
        primaries = run.worker_list[1:]
        run.node.wait_until(
            lambda: all(d in run.inbox.weights for d in primaries),
            self.liveness.barrier(others),
            lambda: f"workers {sorted(set(primaries) - set(run.inbox.weights))} sent no weights",
        )
        state: dict[str, torch.Tensor] = {}
        for part in [run.stage.state(), *(run.inbox.weights[d].tensors for d in primaries)]:
            for key, value in part.items():
                state[key.removeprefix("layers.")] = value
        return state

    def save_model(self, path: str) -> bool:
        state = self.state
        weights, what = self.collect_weights(), f"{num_layers(state.spec)} layers"
        return save_model(path, weights, what, spec=state.spec, run_id=state.run_id, train=state.train)
