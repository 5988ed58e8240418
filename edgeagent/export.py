"""A trained model users can take elsewhere: safetensors weights with a model card, loaded in one call.

``--save-model model.safetensors`` writes the weights as safetensors (no pickle: any tool that reads
safetensors reads them, and loading runs no code) and, beside them, ``model.json``: the model card, the
same metadata as in the safetensors header (``__metadata__["edgeagent"]``)::

    {"format": 1, "edgeagent": "0.1.0", "run_id": "3f2a9c0d1e4b",
     "model": {"name": "cnn", "in_shape": [1, 8, 8], "num_classes": 10, "options": {}},
     "input_shape": [1, 8, 8], "classes": 10, "dataset": "digits",
     "training": {"epochs": 3, "batch_size": 32, "learning_rate": 0.05, "seed": 0}}

:func:`load_model` (also ``edgeagent.load_model``) rebuilds the ``nn.Sequential`` from the card and loads
the weights. A path ending in ``.pt`` or ``.pth`` is written as before (a torch state dict, with the card
beside it); :func:`load_model` reads those too, with ``weights_only=True``.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import pickle  # only for its exception: torch.load(weights_only=True) raises it
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeagent.errors import StorageError, TrainingError
from edgeagent.ops.files import torch_bytes, write_atomic

if TYPE_CHECKING:
    import torch
    from torch import nn

    from edgeagent.models import ModelSpec

log = logging.getLogger("edgeagent.export")

CARD_FORMAT = 1
LEGACY_SUFFIXES = (".pt", ".pth")


def model_card(spec: ModelSpec, *, run_id: str, dataset: str = "", **training: Any) -> dict[str, Any]:
    """The metadata saved with a model: what it is, what it takes and gives, and which run trained it."""
    return {
        "format": CARD_FORMAT,
        "edgeagent": _version(),
        "run_id": run_id,
        "model": spec.to_dict(),
        "input_shape": list(spec.in_shape),
        "classes": spec.num_classes,
        "dataset": dataset,
        "training": training,
    }


def _version() -> str:
    # Not edgeagent.__version__: the package's __init__ imports this module (load_model) lazily, and an
    # import back up to it would be an arrow against the layers.
    try:
        return importlib.metadata.version("edgeagent")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def card_path(path: str | Path) -> Path:
    """Where the card of the model at ``path`` goes: the same name with ``.json`` (``.card.json`` when the
    model's own name ends in ``.json``)."""
    p = Path(path)
    return p.with_name(p.name + ".card.json") if p.suffix == ".json" else p.with_suffix(".json")


def save_model_file(path: str, state: dict[str, torch.Tensor], card: dict[str, Any]) -> None:
    """Write weights and card atomically (a :class:`StorageError` if the disk refuses)."""
    if Path(path).suffix in LEGACY_SUFFIXES:
        data = torch_bytes(state)
    else:
        from safetensors.torch import save

        # safetensors stores each tensor's own bytes: views of a larger tensor are copied out.
        tensors = {k: v.detach().contiguous().clone() for k, v in state.items()}
        data = save(tensors, metadata={"edgeagent": json.dumps(card)})
    write_atomic(path, data, what="model")
    write_atomic(str(card_path(path)), (json.dumps(card, indent=2) + "\n").encode(), what="model card")


def read_card(path: str | Path) -> dict[str, Any]:
    """The card of a saved model: from the safetensors header, else from the ``.json`` beside it."""
    if Path(path).suffix not in LEGACY_SUFFIXES:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
        except Exception as exc:  # safetensors raises its own SafetensorError (an Exception)
            raise TrainingError(f"cannot read {path} as safetensors: {exc}") from exc
        if "edgeagent" in meta:
            return dict(json.loads(meta["edgeagent"]))
    beside = card_path(path)
    try:
        return dict(json.loads(beside.read_text()))
    except (OSError, ValueError) as exc:
        raise TrainingError(f"{path}: no model card (looked in the file and in {beside}): {exc}") from exc


def load_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The weights of a saved model (safetensors, or an old ``torch.save`` state dict)."""
    if Path(path).suffix in LEGACY_SUFFIXES:
        import torch

        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
            raise TrainingError(f"cannot read the model {path}: {exc}") from exc
        if not isinstance(state, dict):
            raise TrainingError(f"{path} holds no state dict")
        return state
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # SafetensorError, OSError
        raise TrainingError(f"cannot read {path} as safetensors: {exc}") from exc


def load_model(path: str | Path, *, spec: ModelSpec | None = None) -> nn.Sequential:
    """The trained model saved at ``path`` (``--save-model``): an ``nn.Sequential`` in eval mode.

    ``spec`` is for an old state dict without a card: the model it holds (``ModelSpec(name, in_shape,
    num_classes)``).
    """
    from edgeagent.models import ModelSpec, build_model

    if spec is None:
        card = read_card(path)
        if card.get("format") != CARD_FORMAT:
            raise TrainingError(f"{path}: model card format {card.get('format')!r}, not {CARD_FORMAT}")
        spec = ModelSpec.from_dict(card["model"])
    model = build_model(spec, seed=0)
    try:
        model.load_state_dict(load_state(path))
    except RuntimeError as exc:  # missing or unexpected keys, wrong shapes
        raise TrainingError(f"{path} does not fit the model {spec.name}: {exc}") from exc
    return model.eval()


def save_model(path: str, state: dict[str, torch.Tensor], card: dict[str, Any], what: str) -> bool:
    """Write the trained model; a disk that refuses is logged as one line naming the path, the size and
    the free space (False) and the run ends all the same."""
    try:
        save_model_file(path, state, card)
    except StorageError as exc:
        log.error("%s", exc)
        return False
    log.info(
        "saved the trained model (%s, %d tensors) to %s and its card to %s",
        what,
        len(state),
        path,
        card_path(path),
    )
    return True
