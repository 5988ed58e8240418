"""A pipeline run replayed in one process: the stages of a split, driven through 1F1B, no broker.

The offline twin of a run's arithmetic. The staleness rules that follow each stage's own delay
(:mod:`edgeagent.pipeline.staleness`) and the synchronous schedule make a run's weights independent of how
messages interleave, so a run of real processes (without re-splits or faults) ends with the weights
:func:`replay` computes here; the tests hold a 3-process run to that (``tests/integration/test_staleness.py``)
and a rule's unit tests use it to train small problems without a broker.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from edgeagent.models import ModelSpec
from edgeagent.pipeline.build import make_stage
from edgeagent.pipeline.rows import split_rows
from edgeagent.pipeline.schedule import Action, Schedule, one_f_one_b
from edgeagent.pipeline.stage import Stage
from edgeagent.protocol.options import TrainOptions


def build_stages(
    spec: ModelSpec,
    options: TrainOptions,
    points: Sequence[int],
    *,
    seed: int = 0,
    in_flight: int = 0,
    weights: dict[str, torch.Tensor] | None = None,
) -> list[Stage]:
    """The stages of split ``points`` as every device of a run builds them."""
    n = len(points) - 1
    return [
        make_stage(
            spec,
            seed=seed,
            start=points[i],
            end=points[i + 1],
            index=i,
            num_stages=n,
            options=options,
            weights=None if weights is None else _slice(weights, points[i], points[i + 1]),
            in_flight=in_flight,
        )
        for i in range(n)
    ]


def _slice(weights: dict[str, torch.Tensor], start: int, end: int) -> dict[str, torch.Tensor]:
    return {k: v for k, v in weights.items() if start <= int(k.split(".")[1]) < end}


def replay(
    stages: list[Stage],
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    in_flight: int = 0,
    start: int = 0,
) -> list[float]:
    """Train ``stages`` on ``batches`` (inputs, labels) in 1F1B order with ``in_flight`` batches in flight
    (0: one per stage), the first of them batch ``start`` of the run (the stages have applied ``start``
    updates: a run drains its pipeline at every epoch's end, so a run replays epoch by epoch); under the
    sync schedule (``options.micro_batches``) every batch is split into its micro-batches, as the central
    node splits it. Returns every batch's training loss."""
    n = len(stages)
    micro = stages[0].options.micro_batches
    items: list[tuple[torch.Tensor, torch.Tensor, int]] = []  # (x, y, the batch's rows) per message id
    for x, y in batches:
        if micro:
            for lo, hi in split_rows(int(y.shape[0]), [1.0] * micro):
                items.append((x[lo:hi], y[lo:hi], int(y.shape[0])))
        else:
            items.append((x, y, 0))
    bound = in_flight or n
    order = one_f_one_b(n, len(items), bound) if not micro else _flushed(n, len(items), micro, bound)
    # The last stage backwards every batch as soon as it has forwarded it (a worker's session does), also
    # with more batches in flight than stages, where the generated order would warm it up.
    order[n - 1] = [Action(n - 1, kind, b) for b in range(len(items)) for kind in ("F", "B")]
    first = start * micro if micro else start  # the id of the first message
    acts: dict[tuple[int, int], torch.Tensor] = {}
    grads: dict[tuple[int, int], torch.Tensor | None] = {}
    versions: dict[int, int] = {}
    losses = [0.0] * len(batches)
    pos = [0] * n
    remaining = sum(len(v) for v in order.values())
    while remaining:
        progressed = False
        for s in range(n):
            while pos[s] < len(order[s]):
                a = order[s][pos[s]]
                x, y, total = items[a.batch]
                item = first + a.batch
                if a.kind == "F":
                    if s == 0:
                        out, versions[a.batch] = stages[0].forward(item, x)
                    elif (s - 1, a.batch) in acts:
                        out, _ = stages[s].forward(item, acts.pop((s - 1, a.batch)), versions[a.batch])
                    else:
                        break
                    acts[(s, a.batch)] = out
                else:
                    if s == n - 1:
                        acts.pop((s, a.batch), None)
                        result = stages[s].backward(item, labels=y, total=total)
                        losses[a.batch // micro if micro else a.batch] += result.loss
                    elif (s + 1, a.batch) in grads:
                        result = stages[s].backward(item, grad_output=grads.pop((s + 1, a.batch)))
                    else:
                        break
                    grads[(s, a.batch)] = result.grad_input
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the replayed schedule deadlocked")
    return losses


def _flushed(stages: int, items: int, micro: int, bound: int) -> Schedule:
    """PipeDream-flush: 1F1B over each batch's ``micro`` micro-batches, batch after batch."""
    order: Schedule = {s: [] for s in range(stages)}
    for first in range(0, items, micro):
        for s, actions in one_f_one_b(stages, micro, bound).items():
            order[s].extend(Action(a.stage, a.kind, a.batch + first) for a in actions)
    return order


def merged_state(stages: Sequence[Stage]) -> dict[str, torch.Tensor]:
    """The whole model's state dict (``<layer>.<name>`` keys, as ``--save-model`` writes it)."""
    return {k.removeprefix("layers."): v for s in stages for k, v in s.module.state_dict().items()}


__all__ = ["build_stages", "merged_state", "replay"]
