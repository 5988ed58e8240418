"""The resource configurations the predictor's data is collected under (see :mod:`.collect`): a torch
thread count, a CFS CPU quota, a ``taskset`` core list, a batch size and an emulated slowdown; the
training set and the held-out set."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
_CPUS = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


# -- configurations ----------------------------------------------------------------------------------


def _positive_int(value: Any, what: str, limit: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ValueError(f"{what} must be an int in 1..{limit}, got {value!r}")


def _number(value: Any, what: str, low: float, high: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high:
        raise ValueError(f"{what} must be a number in {low}..{high}, got {value!r}")


def parse_cpus(cpus: str) -> list[int]:
    """The cores of a taskset list such as ``"0"``, ``"0-1"`` or ``"0,2-3"`` (ascending ranges only)."""
    if not isinstance(cpus, str) or not _CPUS.match(cpus):
        raise ValueError(f"cpus must be a taskset list like '0', '0-1' or '0,2-3', got {cpus!r}")
    cores: set[int] = set()
    for part in cpus.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if first > last:
            raise ValueError(f"cpus range {part!r} in {cpus!r} runs backwards ({first} > {last})")
        cores.update(range(first, last + 1))
    return sorted(cores)


def config_name(
    threads: int, cpu_quota: float | None, cpus: str | None, batch_size: int, slowdown: float
) -> str:
    """A descriptive name such as ``t2-q0.50-b32-s1`` or ``t2-cpu0-b64-s1`` (no ``q``: no quota)."""
    quota = "" if cpu_quota is None else f"-q{cpu_quota:.2f}"
    cores = "" if cpus is None else f"-cpu{cpus.replace(',', '+')}"
    return f"t{threads}{quota}{cores}-b{batch_size}-s{slowdown:g}"


@dataclass(frozen=True)
class ResourceConfig:
    """One simulated device: torch threads, a CPU quota in cores (None: none), the cores the process may
    run on (a taskset list; None: all), the batch size and the emulated slowdown factor."""

    name: str
    threads: int
    cpu_quota: float | None
    cpus: str | None
    batch_size: int
    slowdown: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(
                f"config name must be 1-64 letters, digits or '._+-' (a cgroup's name), got {self.name!r}"
            )
        _positive_int(self.threads, f"{self.name}: threads", 256)
        if self.cpu_quota is not None:
            # CFS refuses quotas under 1 ms per period; 0.1 cores of the 10 ms period is 1 ms.
            _number(self.cpu_quota, f"{self.name}: cpu_quota (cores)", 0.1, 1024.0)
        if self.cpus is not None:
            parse_cpus(self.cpus)
        _positive_int(self.batch_size, f"{self.name}: batch_size", 65536)
        _number(self.slowdown, f"{self.name}: slowdown", 1.0, 1000.0)

    @classmethod
    def named(
        cls,
        threads: int,
        *,
        cpu_quota: float | None = None,
        cpus: str | None = None,
        batch_size: int = 32,
        slowdown: float = 1.0,
    ) -> ResourceConfig:
        """A configuration named by :func:`config_name`."""
        name = config_name(threads, cpu_quota, cpus, batch_size, slowdown)
        return cls(name, threads, cpu_quota, cpus, batch_size, slowdown)

    @property
    def resources(self) -> tuple[Any, ...]:
        """Everything but the name: two configurations with equal resources measure the same device."""
        return (self.threads, self.cpu_quota, self.cpus, self.batch_size, float(self.slowdown))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict; inverse of :meth:`from_dict`."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ResourceConfig:
        """Rebuild a configuration from :meth:`to_dict` output; unknown or missing keys are errors."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a resource configuration must be a mapping, got {type(d).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [k for k in names if k not in d]
        unknown = sorted(set(d) - set(names))
        if missing or unknown:
            raise ValueError(
                f"resource configuration {dict(d)!r}: missing keys {missing}, unknown keys {unknown}"
            )
        return cls(**{k: d[k] for k in names})


# threads, cpu_quota (cores), cpus, batch size, slowdown
_TRAINING: tuple[tuple[int, float | None, str | None, int, float], ...] = (
    # full machine: threads x batch size
    (1, None, None, 16, 1), (1, None, None, 32, 1), (1, None, None, 64, 1),
    (2, None, None, 32, 1), (2, None, None, 64, 1),
    # CPU quotas, one thread and two
    (1, 0.25, None, 32, 1), (1, 0.5, None, 32, 1), (1, 0.75, None, 32, 1),
    (2, 0.5, None, 32, 1), (2, 1.0, None, 32, 1), (2, 1.5, None, 32, 1),
    # CPU quotas at the other batch sizes
    (1, 0.5, None, 16, 1), (1, 0.75, None, 64, 1),
    # two threads on one core (taskset), alone and under a quota
    (2, None, "0", 32, 1), (2, 0.5, "0", 32, 1), (2, 0.8, "0", 32, 1),
    # more two-thread quotas and batch sizes (a spread as wide as the one-thread rows)
    (2, 0.75, None, 32, 1), (2, 1.75, None, 32, 1), (2, 1.0, None, 64, 1), (2, 0.5, None, 16, 1),
    # emulated slowdowns (the runtime's --slowdown)
    (1, None, None, 16, 4), (1, None, None, 32, 2), (1, None, None, 32, 4), (2, None, None, 64, 2),
)  # fmt: skip

_HELD_OUT: tuple[tuple[int, float | None, str | None, int, float], ...] = (
    (1, 0.35, None, 32, 1),
    (2, 1.25, None, 32, 1),
    (2, 0.6, "1", 32, 1),
    (1, 0.8, None, 48, 1),
)


def _configs(rows: Sequence[tuple[int, float | None, str | None, int, float]]) -> list[ResourceConfig]:
    return [ResourceConfig.named(t, cpu_quota=q, cpus=c, batch_size=b, slowdown=s) for t, q, c, b, s in rows]


def training_configs() -> list[ResourceConfig]:
    """The pre-training configurations (24, as many as the paper's over three CPUs)."""
    return _configs(_TRAINING)


def held_out_configs() -> list[ResourceConfig]:
    """Four configurations outside the training set (a quota, core list or batch size it never saw),
    for testing the predictor on an unseen device and its adaptation (papers/004 Sec. 4.2, Fig. 8)."""
    return _configs(_HELD_OUT)
