"""What every collective here keeps per device and step: its place, the messages that came before its
own gradient, and the mean once it has it (pure).

:class:`StepCollective` holds that state and the steps they all take the same way: refuse a second
:meth:`start`, keep early messages up to a bound (a correct peer sends only a few before this device
starts; beyond that they are counted in ``rejected`` and dropped), and replay them once started.
:class:`UntimedCollective` adds the rest of the :class:`~edgeagent.allreduce.base.Collective` protocol for
the baselines without timeouts (``tree``, ``ring``): done once the mean is known.
"""

from __future__ import annotations

import torch

from edgeagent.allreduce.base import CollectiveMsg, LinkTimeouts, Send
from edgeagent.errors import ConfigError

__all__ = ["StepCollective", "UntimedCollective"]


class StepCollective:
    """The state and steps common to one device's part in one allreduce step."""

    label = "allreduce"  # in error messages

    def __init__(self, rank: int, size: int, step: int, timeouts: LinkTimeouts, *, max_early: int) -> None:
        self.rank, self.size, self.step = rank, size, step
        self.timeouts = timeouts
        self.rejected = 0  # messages dropped as inconsistent or beyond the early bound
        self._started = False
        self._early: list[CollectiveMsg] = []
        self._max_early = max_early
        self._mean: torch.Tensor | None = None

    def receive(self, msg: CollectiveMsg, now: float) -> list[Send]:
        raise NotImplementedError

    def result(self) -> torch.Tensor | None:
        return self._mean

    def _begin(self, grad: torch.Tensor) -> torch.Tensor:
        """Mark the step started; this device's gradient, flat float32 (not a copy)."""
        if self._started:
            raise ConfigError(f"{self.label} step {self.step} rank {self.rank} started twice")
        self._started = True
        return grad.detach().to(torch.float32).flatten()

    def _keep_early(self, msg: CollectiveMsg) -> bool:
        """Keep ``msg`` until :meth:`start`; False (counted in ``rejected``) once ``max_early`` are kept."""
        if len(self._early) >= self._max_early:
            self.rejected += 1
            return False
        self._early.append(msg)
        return True

    def _deferred(self, msg: CollectiveMsg) -> bool:
        """True if ``msg`` is not to be handled now: another step's (ignored) or kept until :meth:`start`."""
        if msg.step != self.step:
            return True
        if not self._started:
            self._keep_early(msg)
            return True
        return False

    def _replay_early(self, out: list[Send], now: float) -> list[Send]:
        """``out`` and what the messages kept before :meth:`start` make this device send."""
        early, self._early = self._early, []
        for msg in early:
            out += self.receive(msg, now)
        return out


class UntimedCollective(StepCollective):
    """A collective without timeouts: nothing to tick, done once it holds the mean."""

    def tick(self, now: float) -> list[Send]:
        return []

    def next_deadline(self) -> float | None:
        return None

    def done(self) -> bool:
        return self._mean is not None
