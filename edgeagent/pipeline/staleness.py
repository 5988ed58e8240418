"""Staleness compensation: how a pipeline stage trains on gradients computed on older weights.

Pure policy (tensor arithmetic, no I/O); :class:`~edgeagent.pipeline.stage.Stage` applies it. Every rule is
a :class:`Compensation` chosen once per run (``TrainConfig.staleness``, ``--staleness``).

Note: the delay of a stage.
    The pipeline applies updates in batch order, so the update of batch ``b`` always lands on weight
    version ``b`` (``b`` updates applied). A batch forwarded with version ``v`` is ``b - v`` updates
    stale. Under 1F1B with ``K`` batches in flight (:func:`edgeagent.pipeline.schedule.stage_bound`), stage
    ``i`` of a pipeline holds at most ``K - i`` batches between forward and backward, so when it forwards
    ``b`` it has applied at least ``b - (K - 1 - i)`` updates: version ``b - delay_i`` with
    ``delay_i = K - 1 - i`` (:func:`stage_delay`) is always there, on every device, whatever the timing.
    The rules that compensate (``predict``, ``nesterov``, ``lookahead``) forward exactly that version, so
    every stage compensates for its own delay and a run is the same arithmetic however messages
    interleave (a 3-process run equals :mod:`edgeagent.pipeline.replay`'s offline run). FTPipeHD's rules
    (``none``, ``aggregate``) keep vertical sync instead (papers/000 Sec. III-C): every stage forwards a
    batch with the version stage 0 used, ``K - 1`` updates stale on every stage.

The rules (``docs/design.md``, "Staleness compensation", has the measurements that chose the default):

``none``
    Vertical sync, plain SGD: FTPipeHD without weight aggregation (the baseline "plain async").
``aggregate``
    FTPipeHD as the paper has it (Sec. III-C): vertical sync, and every ``n - i`` updates stage ``i``
    replaces its weights by the mean of its last ``n - i`` versions.
``predict``
    Weight prediction (SpecTrain, Chen et al. 2018; PipeOptim, arXiv 2312.00839): the forward (and its
    backward) runs on the weights predicted for the step at which the gradient will be applied,
    ``w_v - lr * h * m_v`` for momentum SGD (``m_v`` the momentum buffer, ``h = b - v`` the stage's own
    delay); the update is the user's SGD.
``nesterov``
    The delay-aware Nesterov step of Ajanthan et al. (ICML 2025, arXiv 2505.01099) in SGD form: Nesterov
    momentum whose coefficient grows with the stage's delay, ``mu + delay * (0.99 - mu) / K`` (the
    official code's ``--adaptive_momentum``), the learning rate scaled by ``(1 - mu') / (1 - mu)`` so the
    long-run step ``lr / (1 - mu)`` stays the user's (their Adam form needs no such scaling: Adam's step
    does not grow with its first moment's coefficient). No forward prediction: the look-ahead is the
    Nesterov step's.
``lookahead`` (ours)
    ``nesterov``, with the forward predicted for the stage's delay as in ``predict`` (from the Nesterov
    step's own velocity).

With one batch in flight nothing is stale and every rule is the user's SGD, bit for bit.
``2bw``
    PipeDream-2BW (Narayanan et al., ICML 2021): the gradients of ``m = K`` consecutive batches are
    averaged into one update, and every batch of a window forwards the weights before the previous
    window's update: a constant delay of one update, two weight versions. A window is ``m`` of the
    user's batches, so an update sees ``m`` times the batch (and there are ``m`` times fewer of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from edgeagent.protocol.options import Staleness

if TYPE_CHECKING:  # torch is imported by the functions that compute: the configuration reads this module
    import torch

STALENESS_RULES: tuple[str, ...] = get_args(Staleness)
DEFAULT_STALENESS: Staleness = "lookahead"
VERTICAL_SYNC: tuple[str, ...] = ("none", "aggregate")
"""Rules that forward a batch with the version stage 0 used (vertical sync), not the stage's own delay."""
MOMENTUM_CEILING = 0.99
"""The momentum the most-delayed stage is raised to (``nesterov``, ``lookahead``): Ajanthan et al.'s 0.99."""


@dataclass(frozen=True)
class StepRule:
    """One stage's optimizer step: heavy-ball (torch.optim.SGD) or Nesterov momentum, its coefficient,
    its learning rate, and how far ahead its forward weights are predicted (0: not at all)."""

    learning_rate: float
    momentum: float
    weight_decay: float
    nesterov: bool = False
    predict: bool = False


def stage_delay(in_flight: int, stage: int, num_stages: int, *, replicated: bool = False) -> int:
    """Updates between stage ``stage``'s forward of a batch and that batch's update, under 1F1B with
    ``in_flight`` batches in flight (see the module note): ``K - 1 - i``, 0 on the last stage (it
    forwards and backwards each batch at once). A stage held by several devices (hybrid) waits for its
    members' gradients before each update, so it takes one update more of slack."""
    if in_flight < 1 or not 0 <= stage < num_stages:
        raise ValueError(f"stage {stage} of {num_stages} with {in_flight} batches in flight")
    delay = 0 if stage == num_stages - 1 else max(1, in_flight - stage) - 1
    return delay + (1 if replicated else 0)


def raised_momentum(momentum: float, delay: int, scale: int) -> float:
    """``momentum + delay * (0.99 - momentum) / scale``: the coefficient grows with the delay (never
    lowered: a user's momentum above 0.99 is kept)."""
    if delay <= 0 or scale <= 0 or momentum >= MOMENTUM_CEILING:
        return momentum
    return momentum + min(delay, scale) * (MOMENTUM_CEILING - momentum) / scale


def step_rule(
    staleness: str,
    *,
    learning_rate: float,
    momentum: float,
    weight_decay: float,
    delay: int,
    depth: int,
) -> StepRule:
    """The step of a stage ``delay`` updates stale in a pipeline with ``depth`` batches in flight."""
    if staleness not in STALENESS_RULES:
        raise ValueError(f"unknown staleness rule {staleness!r}; allowed: {', '.join(STALENESS_RULES)}")
    plain = StepRule(learning_rate, momentum, weight_decay)
    if staleness in ("none", "aggregate", "2bw") or depth <= 1 or momentum <= 0:
        return plain  # no pipelining (one batch in flight) is plain SGD; no momentum, nothing to predict
    if staleness == "predict":
        return StepRule(learning_rate, momentum, weight_decay, predict=delay > 0)
    # Nesterov on every stage of a pipelined run, the last (no delay) included: with the last stage on
    # heavy-ball momentum the runs ended 1-4 points lower (docs/design.md, "Staleness compensation").
    raised = raised_momentum(momentum, delay, depth)
    rate = learning_rate * (1 - raised) / (1 - momentum)  # the long-run step lr / (1 - mu) kept
    return StepRule(rate, raised, weight_decay, nesterov=True, predict=staleness == "lookahead" and delay > 0)


def forward_version(
    staleness: str, batch_id: int, *, asked: int | None, base: int, newest: int, delay: int, window: int
) -> int:
    """The weight version stage forwards batch ``batch_id`` with.

    ``asked``: the version in the batch's message (vertical sync; None on stage 0, which takes its
    newest); ``base``: the oldest version this stage has had since it was built (a rebuilt stage has none
    before it); ``newest``: its current version; ``window``: 2BW's batches per update.
    """
    if staleness in VERTICAL_SYNC:
        return newest if asked is None else asked
    if staleness == "2bw" and window > 1:
        # Window t = batch_id // m forwards the weights after window t - 2's update (version (t-1)*m).
        version = (batch_id // window - 1) * window
    elif staleness == "2bw":
        version = batch_id  # one batch in flight: nothing is stale
    else:
        version = batch_id - delay
    return min(max(base, version), newest) if asked is None else max(base, version)


def predicted(
    weights: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor], rule: StepRule, horizon: int
) -> dict[str, torch.Tensor]:
    """The weights ``horizon`` steps ahead if every step moved them as the last one did:
    ``w - lr * horizon * m`` (heavy ball), ``w - lr * horizon * mu * m`` (Nesterov, whose step is
    ``lr * (g + mu * m)`` and ``g`` is ``(1 - mu) * m`` on average). New tensors; a parameter without a
    momentum buffer yet is kept as it is."""
    if horizon <= 0 or not rule.predict:
        return weights
    import torch

    scale = rule.learning_rate * horizon * (rule.momentum if rule.nesterov else 1.0)
    names = [name for name in weights if name in momentum]
    if not names:
        return weights  # no momentum yet (the first updates): nothing to extrapolate
    out = dict(weights)  # a parameter without a momentum buffer yet stays as it is
    # One multi-tensor call (torch.optim's own fast path) instead of one Python op per parameter: a
    # MobileNetV2 stage has over a hundred, and every forward of a delayed stage predicts them.
    with torch.no_grad():
        ahead = torch._foreach_add([weights[n] for n in names], [momentum[n] for n in names], alpha=-scale)
    out.update(zip(names, ahead, strict=True))
    return out


__all__ = [
    "DEFAULT_STALENESS",
    "MOMENTUM_CEILING",
    "STALENESS_RULES",
    "VERTICAL_SYNC",
    "Staleness",
    "StepRule",
    "forward_version",
    "predicted",
    "raised_momentum",
    "stage_delay",
    "step_rule",
]
