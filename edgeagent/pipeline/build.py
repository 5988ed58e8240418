"""Building a stage from the model spec: only its own layers, optionally with weights and momentum."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec, build_layers
from edgeagent.pipeline import audit
from edgeagent.pipeline.schedule import stage_bound
from edgeagent.pipeline.stage import Stage, StageModule
from edgeagent.pipeline.staleness import stage_delay
from edgeagent.protocol.options import TrainOptions


def build_stage(
    spec: ModelSpec,
    *,
    seed: int,
    options: TrainOptions,
    points: Sequence[int],
    index: int,
    weights: dict[str, torch.Tensor] | None = None,
    momentum_buffers: dict[str, torch.Tensor] | None = None,
    version: int = 0,
    in_flight: int = 0,
    replicated: bool = False,
) -> Stage:
    """Stage ``index`` of the split ``points``; of ``weights`` and ``momentum_buffers`` (whole-model or
    partial state, keys ``layers.<j>.<name>``) it takes the layers it owns. ``in_flight``: the run's bound
    on batches in flight (0: the number of stages); ``replicated``: the stage is held by several devices."""
    start, end = points[index], points[index + 1]
    return make_stage(
        spec,
        seed=seed,
        start=start,
        end=end,
        index=index,
        num_stages=len(points) - 1,
        options=options,
        weights=layer_slice(weights, start, end) or None,
        momentum_buffers=layer_slice(momentum_buffers, start, end) or None,
        version=version,
        in_flight=in_flight,
        replicated=replicated,
    )


def layer_slice(
    state: dict[str, torch.Tensor] | None, start: int, end: int
) -> dict[str, torch.Tensor] | None:
    """The entries of layers ``[start, end)`` of a state dict with ``layers.<j>.`` keys."""
    if state is None:
        return None
    return {k: v for k, v in state.items() if start <= int(k.split(".")[1]) < end}


def make_stage(
    spec: ModelSpec,
    *,
    seed: int,
    start: int,
    end: int,
    index: int,
    num_stages: int,
    options: TrainOptions,
    weights: dict[str, torch.Tensor] | None = None,
    momentum_buffers: dict[str, torch.Tensor] | None = None,
    version: int = 0,
    in_flight: int = 0,
    replicated: bool = False,
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
    depth = in_flight or num_stages
    stage = Stage(
        module,
        options,
        is_first=index == 0,
        is_last=index == num_stages - 1,
        version=version,
        # FTPipeHD's window, n - i versions (papers/000 Sec. III-C), with the run's batches in flight.
        aggregation_window=stage_bound(depth, index),
        delay=stage_delay(depth, index, num_stages, replicated=replicated),
        depth=depth,
    )
    if momentum_buffers:
        stage.load_momentum(momentum_buffers)
    stage.audit_copy = audit.built(index, start, end, version, seeded=weights is None)
    return stage
