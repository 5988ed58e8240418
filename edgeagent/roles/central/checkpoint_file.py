"""A checkpoint and a trained model on disk: written whole or not at all, read back with tensors and plain
data only. No run state: the node, the run directory and every mode's run read and write through these."""

from __future__ import annotations

import logging
import pickle  # only for its exception: torch.load(weights_only=True) raises it
from typing import Any

import torch

from edgeagent.errors import StorageError, TrainingError
from edgeagent.ops.files import torch_bytes, write_atomic

log = logging.getLogger("edgeagent.roles.central")


def load_checkpoint(path: str) -> dict[str, Any]:
    """A checkpoint written by the central node; only tensors and plain data (``weights_only=True``)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise TrainingError(f"cannot read the checkpoint {path}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != 1:
        raise TrainingError(f"{path} is not an edgeagent checkpoint (format 1)")
    return state


def checkpoint_version(state: dict[str, Any]) -> int:
    """Where a checkpoint stands: the pipeline modes' weight version, the allreduce mode's step, the
    split-federated mode's epoch (what its file name says)."""
    for key in ("version", "step", "epoch"):
        if isinstance(state.get(key), int):
            return int(state[key])
    return -1


def save_checkpoint(path: str, state: dict[str, Any]) -> None:
    """Write ``state`` (tensors and plain data) as a format-1 checkpoint at ``path``, atomically and
    durably (:func:`~edgeagent.ops.files.write_atomic`; a :class:`StorageError` if the disk refuses). A
    run's checkpoints go through :meth:`RunDirectory.save <edgeagent.roles.central.runs.RunDirectory.save>`,
    which names them by run and version."""
    write_atomic(path, torch_bytes({"format": 1, **state}), what="checkpoint", mode=0o600)


def save_model(path: str, state: dict[str, torch.Tensor], what: str) -> bool:
    """Write the trained model (a state dict) to ``path`` atomically; a disk that refuses is logged as one
    line naming the path, the size and the free space (False) and the run ends all the same."""
    try:
        write_atomic(path, torch_bytes(state), what="model")
    except StorageError as exc:
        log.error("%s", exc)
        return False
    log.info("saved the trained model (%s, %d tensors) to %s", what, len(state), path)
    return True


def resume_of(state: dict[str, Any], mode: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A loaded checkpoint (``--resume``) checked to be of a ``mode`` run holding ``keys``."""
    if state.get("mode") != mode:
        kind = state.get("mode", "pipeline")
        raise TrainingError(f"--resume: the checkpoint is of a {kind} run, not of a {mode} one")
    missing = [k for k in keys if k not in state]
    if missing:
        raise TrainingError(f"--resume: the {mode} checkpoint lacks {missing}")
    return state
