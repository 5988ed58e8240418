"""A checkpoint and a trained model on disk: written whole or not at all, read back with tensors and plain
data only. No run state: the node, the run directory and every mode's run read and write through these."""

from __future__ import annotations

import logging
import pickle  # only for its exception: torch.load(weights_only=True) raises it
from typing import Any

import torch

from edgeagent import export
from edgeagent.config import TrainConfig
from edgeagent.errors import TrainingError
from edgeagent.export import model_card
from edgeagent.models import ModelSpec
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


def save_model(
    path: str, state: dict[str, torch.Tensor], what: str, *, spec: ModelSpec, run_id: str, train: TrainConfig
) -> bool:
    """Write the trained model to ``path`` with its card (:mod:`edgeagent.export`: safetensors, or a state
    dict for ``.pt``); a disk that refuses is logged as one line and the run ends all the same (False)."""
    card = model_card(
        spec,
        run_id=run_id,
        dataset=train.dataset,
        epochs=train.epochs,
        batch_size=train.batch_size,
        learning_rate=train.learning_rate,
        seed=train.seed,
    )
    return export.save_model(path, state, card, what)


def resume_of(state: dict[str, Any], mode: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A loaded checkpoint (``--resume``) checked to be of a ``mode`` run holding ``keys``."""
    if state.get("mode") != mode:
        kind = state.get("mode", "pipeline")
        raise TrainingError(f"--resume: the checkpoint is of a {kind} run, not of a {mode} one")
    missing = [k for k in keys if k not in state]
    if missing:
        raise TrainingError(f"--resume: the {mode} checkpoint lacks {missing}")
    return state
