"""The links under the collectives (pure policy, no I/O): injected link failures and per-link timeouts.

* :class:`FailedLinks` is ``--fail-link A,B@FROM:TO``: every message between devices A and B, both ways,
  is dropped during steps FROM..TO (``A,B@FROM``: from then on). The allreduce mode asks it before each
  publish, below the collective, so the collective only sees silence; it is keyed by step, hence the same
  in every run.
* :class:`FixedTimeouts` is the thesis's fixed timeout (0.5 s or 1 s); :class:`AdaptiveTimeouts` derives a
  link's timeout from its measured round trips as TCP's retransmission timer does (RFC 6298: smoothed
  RTT + 4 x its mean deviation, with a floor), so a fast link times out in milliseconds and a slow one is
  not given up on too early. Both are :class:`edgeagent.allreduce.base.LinkTimeouts`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from edgeagent.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class LinkFailure:
    """Devices ``a`` and ``b`` cannot talk during steps ``first``..``last`` (None: to the end)."""

    a: str
    b: str
    first: int
    last: int | None = None

    def covers(self, x: str, y: str, step: int) -> bool:
        return {x, y} == {self.a, self.b} and self.first <= step and (self.last is None or step <= self.last)

    def text(self) -> str:
        return f"{self.a},{self.b}@{self.first}" + (f":{self.last}" if self.last is not None else "")


def parse_failure(text: str) -> LinkFailure:
    """``"worker-1,worker-3@20:200"`` (steps 20 to 200) or ``"worker-1,worker-3@20"`` (from step 20 on)."""
    pair, sep, when = text.partition("@")
    a, comma, b = pair.partition(",")
    first, colon, last = when.partition(":")
    try:
        if not (sep and comma and a and b) or a == b:
            raise ValueError
        failure = LinkFailure(a.strip(), b.strip(), int(first), int(last) if colon else None)
    except ValueError:
        raise ConfigError(
            f"--fail-link {text!r}: expected A,B@FROM:TO or A,B@FROM with two device ids and step numbers, "
            "e.g. worker-1,worker-3@20:200"
        ) from None
    if failure.first < 0 or (failure.last is not None and failure.last < failure.first):
        raise ConfigError(f"--fail-link {text!r}: expected A,B@FROM:TO with 0 <= FROM <= TO")
    return failure


class FailedLinks:
    """Every injected link failure of a run (see the module doc)."""

    def __init__(self, failures: Iterable[LinkFailure] = ()) -> None:
        self.failures = tuple(failures)

    @classmethod
    def parse(cls, texts: Iterable[str]) -> FailedLinks:
        return cls(parse_failure(t) for t in texts)

    def blocked(self, sender: str, receiver: str, step: int) -> bool:
        """Whether a message of step ``step`` from ``sender`` to ``receiver`` is lost."""
        return any(f.covers(sender, receiver, step) for f in self.failures)

    def failed_at(self, step: int) -> list[str]:
        """The failures in force at ``step`` (as ``A,B@FROM:TO``), for the run report."""
        return [f.text() for f in self.failures if f.first <= step and (f.last is None or step <= f.last)]


@dataclasses.dataclass(frozen=True)
class FixedTimeouts:
    """The thesis's fixed timeout: the same ``seconds`` on every link."""

    seconds: float

    def timeout(self, peer: int) -> float:
        return self.seconds

    def observe(self, peer: int, rtt: float) -> None:
        """Round trips change nothing here."""


class AdaptiveTimeouts:
    """Per link: ``srtt + k * rttvar`` (RFC 6298's estimator, gains 1/8 and 1/4), at least ``floor``; before
    the first sample of a link, ``initial``. Keyed by the peer's device id, so ranks that change when the
    members change keep their links' history (``ranks`` maps the current ranks to ids)."""

    def __init__(
        self, *, floor: float = 0.02, initial: float = 1.0, k: float = 4.0, ceiling: float = 10.0
    ) -> None:
        self.floor, self.initial, self.k, self.ceiling = floor, initial, k, ceiling
        self.srtt: dict[str, float] = {}
        self.rttvar: dict[str, float] = {}
        self.ranks: list[str] = []

    def _id(self, peer: int) -> str:
        return self.ranks[peer] if 0 <= peer < len(self.ranks) else str(peer)

    def observe(self, peer: int, rtt: float) -> None:
        """A measured round trip on the link to ``peer`` (seconds)."""
        if rtt < 0:
            return
        key = self._id(peer)
        srtt = self.srtt.get(key)
        if srtt is None:
            self.srtt[key], self.rttvar[key] = rtt, rtt / 2
            return
        self.rttvar[key] = 0.75 * self.rttvar[key] + 0.25 * abs(srtt - rtt)
        self.srtt[key] = 0.875 * srtt + 0.125 * rtt

    def timeout(self, peer: int) -> float:
        key = self._id(peer)
        srtt = self.srtt.get(key)
        if srtt is None:
            return self.initial
        return min(self.ceiling, max(self.floor, srtt + self.k * self.rttvar[key]))

    def summary(self) -> dict[str, float]:
        """The current timeout per link, for metrics."""
        return {
            peer: round(min(self.ceiling, max(self.floor, s + self.k * self.rttvar[peer])), 4)
            for peer, s in sorted(self.srtt.items())
        }
