"""edgeagent: train one PyTorch model across several small edge devices as an asynchronous pipeline
over MQTT."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def load_model(path: str) -> Any:
    """The model ``--save-model`` wrote: an ``nn.Sequential`` with the trained weights, in eval mode.

    ``edgeagent.load_model("model.safetensors")``; see :func:`edgeagent.export.load_model`. Imports torch
    only when called: ``import edgeagent`` stays light.
    """
    from edgeagent.export import load_model as _load_model

    return _load_model(path)
