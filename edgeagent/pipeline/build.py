"""Building a stage from the model spec: only its own layers, optionally with weights and momentum."""

from __future__ import annotations

import torch

from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec, build_layers
from edgeagent.pipeline.stage import Stage, StageModule, StageOptions


def make_stage(
    spec: ModelSpec,
    *,
    seed: int,
    start: int,
    end: int,
    index: int,
    num_stages: int,
    learning_rate: float,
    momentum: float,
    weight_decay: float,
    aggregation: bool,
    aggregation_interval: int,
    weights: dict[str, torch.Tensor] | None = None,
    momentum_buffers: dict[str, torch.Tensor] | None = None,
    version: int = 0,
) -> Stage:
    """Stage ``index`` of ``num_stages`` owning layers ``[start, end)``.

    Without ``weights`` the layers keep their seeded initial values (the same on every device);
    with them, every parameter and buffer must be given (keys ``layers.<j>.<name>``).
    """
    layers = build_layers(spec, start, end, seed=seed)
    module = StageModule({start + k: layer for k, layer in enumerate(layers)})
    if weights is not None:
        try:
            module.load_state_dict(weights, strict=True)
        except RuntimeError as exc:
            raise TrainingError(f"weights for layers [{start}, {end}) do not fit: {exc}") from exc
    options = StageOptions(
        learning_rate=learning_rate,
        momentum=momentum,
        weight_decay=weight_decay,
        aggregation=aggregation,
        aggregation_window=num_stages - index,
        aggregation_interval=aggregation_interval,
    )
    stage = Stage(module, options, is_first=index == 0, is_last=index == num_stages - 1, version=version)
    if momentum_buffers:
        stage.load_momentum(momentum_buffers)
    return stage
