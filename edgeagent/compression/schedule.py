"""Adaptive bit widths (AccEPT Sec. 3.3 and 4.3.1): which codec a link uses at a given epoch.

The paper starts the forward codec at 2 bits and adds one bit each time the learning rate changes,
up to 4: a coarse code is enough (and fast) early, while a finer one helps convergence late. The
backward codec does the opposite: 8 bits at first, when gradients change most, then 4 bits once
the learning rate has dropped. :class:`BitSchedule` is that rule as data, and :func:`auto_bits`
chooses a width from the measured link instead (Sec. 4.3.1: wide codes on fast links, narrow ones
on slow links).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from edgeagent.compression.base import Role
from edgeagent.errors import ConfigError

NO_COMPRESSION = 32
"""Bit width that stands for the ``none`` codec (float32 as it is)."""

FORWARD_BITS = (2, 3, 4, NO_COMPRESSION)
BACKWARD_BITS = (8, 4, NO_COMPRESSION)


def wire_id_for(role: Role, bits: int) -> str:
    """The codec wire id for ``bits`` on a link of ``role`` (32 -> ``none``)."""
    allowed = FORWARD_BITS if role is Role.ACTIVATION else BACKWARD_BITS
    if bits not in allowed:
        raise ConfigError(f"{role.value} bit width must be one of {allowed}, got {bits}")
    if bits == NO_COMPRESSION:
        return "none"
    return f"mbq{bits}" if role is Role.ACTIVATION else f"sq{bits}"


def _check_steps(name: str, bits: tuple[int, ...], epochs: tuple[int, ...], allowed: tuple[int, ...]) -> None:
    if not bits or any(b not in allowed for b in bits):
        raise ConfigError(f"BitSchedule.{name} must be a non-empty sequence of {allowed}, got {list(bits)}")
    if any(e < 0 for e in epochs) or any(b <= a for a, b in itertools.pairwise(epochs)):
        raise ConfigError(f"BitSchedule.{name}_epochs must be increasing epochs >= 0, got {list(epochs)}")


def _step(bits: tuple[int, ...], epochs: tuple[int, ...], epoch: int) -> int:
    passed = sum(1 for e in epochs if e <= epoch)
    return bits[min(passed, len(bits) - 1)]  # the last width stays: the paper's upper (lower) limit


@dataclass(frozen=True)
class BitSchedule:
    """Forward and backward bit widths per epoch (Sec. 3.3, "adaptive bit width").

    ``forward[0]`` applies before ``forward_epochs[0]``, ``forward[i]`` from ``forward_epochs[i-1]``
    on; once the widths run out the last one stays. Same for ``backward``. With the defaults and
    :meth:`from_lr_milestones` this is exactly the paper's rule.
    """

    forward: tuple[int, ...] = (2, 3, 4)
    forward_epochs: tuple[int, ...] = ()
    backward: tuple[int, ...] = (8, 4)
    backward_epochs: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_steps("forward", self.forward, self.forward_epochs, FORWARD_BITS)
        _check_steps("backward", self.backward, self.backward_epochs, BACKWARD_BITS)

    @classmethod
    def from_lr_milestones(
        cls,
        milestones: Sequence[int],
        *,
        forward: tuple[int, ...] = (2, 3, 4),
        backward: tuple[int, ...] = (8, 4),
    ) -> BitSchedule:
        """The paper's rule: +1 forward bit at every learning-rate change, 8 -> 4 backward at the first."""
        epochs = tuple(sorted(set(milestones)))
        return cls(forward=forward, forward_epochs=epochs, backward=backward, backward_epochs=epochs[:1])

    @classmethod
    def fixed(cls, forward: int, backward: int) -> BitSchedule:
        """The same widths for the whole run (the fixed-k baselines of Table 4)."""
        return cls(forward=(forward,), backward=(backward,))

    def forward_bits(self, epoch: int) -> int:
        """Bit width of the activation codec at ``epoch`` (32 means no compression)."""
        return _step(self.forward, self.forward_epochs, epoch)

    def backward_bits(self, epoch: int) -> int:
        """Bit width of the gradient codec at ``epoch`` (32 means no compression)."""
        return _step(self.backward, self.backward_epochs, epoch)

    def wire_ids(self, epoch: int) -> tuple[str, str]:
        """(activation codec, gradient codec) wire ids at ``epoch``."""
        return (
            wire_id_for(Role.ACTIVATION, self.forward_bits(epoch)),
            wire_id_for(Role.GRADIENT, self.backward_bits(epoch)),
        )


def auto_bits(
    bandwidth_bytes_per_s: float,
    tensor_bytes: int,
    compute_seconds: float,
    *,
    choices: Sequence[int] = (2, 3, 4),
    target: float = 1.0,
) -> int:
    """Bit width for a link, from its bandwidth and the compute time it has to hide behind.

    Rule: a k-bit transfer of a float32 tensor of ``tensor_bytes`` takes
    ``tensor_bytes * k / 32 / bandwidth`` seconds (the few bytes of params are ignored). In a
    pipeline that transfer overlaps the next micro-batch's compute, so the link is not the
    bottleneck while it takes at most ``target * compute_seconds``. Return 32 (no compression)
    when the raw tensor already fits; otherwise the widest choice that fits, since more bits mean
    less quantization error; and when none fits, the narrowest choice, which makes the link as
    little of a bottleneck as it can be.
    """
    if not (math.isfinite(bandwidth_bytes_per_s) and bandwidth_bytes_per_s > 0):
        raise ValueError(f"bandwidth must be a positive number of bytes/s, got {bandwidth_bytes_per_s}")
    if tensor_bytes < 0 or compute_seconds < 0 or not target > 0:
        raise ValueError(
            f"need tensor_bytes >= 0, compute_seconds >= 0 and target > 0; got {tensor_bytes}, "
            f"{compute_seconds}, {target}"
        )
    if not choices or any(not 1 <= b < NO_COMPRESSION for b in choices):
        raise ValueError(f"choices must be bit widths in [1, 31], got {list(choices)}")
    budget = target * compute_seconds

    def transfer(bits: int) -> float:
        return tensor_bytes * bits / NO_COMPRESSION / bandwidth_bytes_per_s

    if transfer(NO_COMPRESSION) <= budget:
        return NO_COMPRESSION
    fitting = [b for b in choices if transfer(b) <= budget]
    return max(fitting) if fitting else min(choices)


def adaptive_schedule(epochs: int) -> BitSchedule:
    """The paper's adaptive widths (Sec. 3.3, 4.3.2) for a run of ``epochs`` with a constant learning
    rate: forward 2 -> 3 -> 4 bits at a third and two thirds of the run (the paper steps at every
    learning-rate change), gradients 8 -> 4 bits at four fifths (epoch 160 of 200 for MobileNetV2)."""
    if epochs < 1:
        raise ConfigError(f"adaptive_schedule needs epochs >= 1, got {epochs}")
    return BitSchedule(
        forward=(2, 3, 4),
        forward_epochs=(max(1, epochs // 3), max(2, 2 * epochs // 3)),
        backward=(8, 4),
        backward_epochs=(max(1, 4 * epochs // 5),),
    )


def adaptive_for(epochs: int, milestones: Sequence[int] = ()) -> BitSchedule:
    """``--compression adaptive`` for a run: the paper's rule on the run's learning-rate milestones
    (:meth:`BitSchedule.from_lr_milestones`: +1 forward bit at each, gradients 8 -> 4 at the first) when
    its schedule has them, else :func:`adaptive_schedule`'s fractions of ``epochs``."""
    return BitSchedule.from_lr_milestones(milestones) if milestones else adaptive_schedule(epochs)


def link_bits(bandwidth_bytes_per_s: float, tensor_bytes: int, compute_seconds: float) -> tuple[int, int]:
    """``auto`` compression of one link: (activation bits, gradient bits).

    The gradient crossing the link back has the activation's size: 8 bits where an 8-bit transfer
    hides behind the compute, 4 where even that would not, none where the raw tensor already fits.
    """
    forward = auto_bits(bandwidth_bytes_per_s, tensor_bytes, compute_seconds)
    backward = auto_bits(bandwidth_bytes_per_s, tensor_bytes, compute_seconds, choices=(4, 8))
    return forward, backward


def stage_bits(
    mode: str,
    stages: int,
    *,
    epoch: int,
    epochs: int,
    links: Sequence[tuple[float, int]] = (),
    compute_seconds: float = 0.0,
    milestones: Sequence[int] = (),
) -> tuple[list[int], list[int]]:
    """Bit widths per stage (forward: its activations; backward: its gradients; 32 = none).

    ``mode``: ``none``, ``2``/``3``/``4`` (fixed, 8-bit gradients), ``adaptive`` (the paper's schedule:
    on the learning rate's ``milestones`` where the run has them, else over ``epochs``) or ``auto``: per
    link ``k`` (``links[k]`` = bandwidth in bytes/s and the bytes of the
    activation crossing it), the widest widths whose transfers hide behind ``compute_seconds``.
    """
    none = [NO_COMPRESSION] * stages
    if mode == "none" or stages < 2:
        return none, list(none)
    if mode in ("2", "3", "4"):
        return [int(mode)] * stages, [8] * stages
    if mode == "adaptive":
        schedule = adaptive_for(epochs, milestones)
        return [schedule.forward_bits(epoch)] * stages, [schedule.backward_bits(epoch)] * stages
    if mode != "auto":
        raise ConfigError(f"compression {mode!r}: expected none, 2, 3, 4, adaptive or auto")
    forward, backward = list(none), list(none)
    for k, (bandwidth, size) in enumerate(links):
        forward[k], backward[k + 1] = link_bits(bandwidth, size, compute_seconds)
    return forward, backward
