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

# A CPU of another kind, emulated: the instruction set ATen's kernels (ATEN_CPU_CAPABILITY) and oneDNN's
# (ONEDNN_MAX_CPU_ISA) may use, below this machine's own (AVX-512 here). Unlike a quota or a slowdown it
# changes every layer by a different factor (measured here, one thread, batch 32: SSE runs the first
# layers 1.6-1.8x and layer 18 3.5x the native time, the middle ones 1.1-1.9x; AVX2 runs the first layers
# 0.6-0.8x and the rest 0.9-1.1x), as a Raspberry Pi's NEON or an older laptop's AVX2 would.
ISAS = {"avx2": ("avx2", "AVX2"), "sse": ("default", "SSE41")}  # name: (ATen capability, oneDNN ISA)
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
    threads: int,
    cpu_quota: float | None,
    cpus: str | None,
    batch_size: int,
    slowdown: float,
    isa: str | None = None,
) -> str:
    """A descriptive name such as ``t2-q0.50-b32-s1``, ``t2-cpu0-b64-s1`` (no ``q``: no quota) or
    ``t1-b32-s1-avx2`` (an emulated instruction set)."""
    quota = "" if cpu_quota is None else f"-q{cpu_quota:.2f}"
    cores = "" if cpus is None else f"-cpu{cpus.replace(',', '+')}"
    kind = "" if isa is None else f"-{isa}"
    return f"t{threads}{quota}{cores}-b{batch_size}-s{slowdown:g}{kind}"


@dataclass(frozen=True)
class ResourceConfig:
    """One simulated device: torch threads, a CPU quota in cores (None: none), the cores the process may
    run on (a taskset list; None: all), the batch size, the emulated slowdown factor and the instruction
    set the kernels may use (one of :data:`ISAS`; None: this machine's own)."""

    name: str
    threads: int
    cpu_quota: float | None
    cpus: str | None
    batch_size: int
    slowdown: float
    isa: str | None = None

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
        if self.isa is not None and self.isa not in ISAS:
            raise ValueError(f"{self.name}: isa must be one of {sorted(ISAS)} or None, got {self.isa!r}")

    @classmethod
    def named(
        cls,
        threads: int,
        *,
        cpu_quota: float | None = None,
        cpus: str | None = None,
        batch_size: int = 32,
        slowdown: float = 1.0,
        isa: str | None = None,
    ) -> ResourceConfig:
        """A configuration named by :func:`config_name`."""
        name = config_name(threads, cpu_quota, cpus, batch_size, slowdown, isa)
        return cls(name, threads, cpu_quota, cpus, batch_size, slowdown, isa)

    @property
    def resources(self) -> tuple[Any, ...]:
        """Everything but the name: two configurations with equal resources measure the same device."""
        return (self.threads, self.cpu_quota, self.cpus, self.batch_size, float(self.slowdown), self.isa)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict; inverse of :meth:`from_dict`."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ResourceConfig:
        """Rebuild a configuration from :meth:`to_dict` output; unknown or missing keys are errors (``isa``
        may be missing: records from before it existed ran on the machine's own)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a resource configuration must be a mapping, got {type(d).__name__}")
        d = {"isa": None, **d}
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [k for k in names if k not in d]
        unknown = sorted(set(d) - set(names))
        if missing or unknown:
            raise ValueError(
                f"resource configuration {dict(d)!r}: missing keys {missing}, unknown keys {unknown}"
            )
        return cls(**{k: d[k] for k in names})


_Base = tuple[int, float | None, str | None, int, float]
_Row = _Base | tuple[int, float | None, str | None, int, float, str]

# threads, cpu_quota (cores), cpus, batch size, slowdown[, isa]
_TRAINING: tuple[_Row, ...] = (
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
    # CPUs of two other kinds, emulated (ISAS): the paper's three CPUs
    (1, None, None, 32, 1, "avx2"), (2, None, None, 32, 1, "avx2"), (1, 0.5, None, 32, 1, "avx2"),
    (2, 1.0, None, 64, 1, "avx2"),
    (1, None, None, 32, 1, "sse"), (2, None, None, 64, 1, "sse"), (1, 0.5, None, 16, 1, "sse"),
    (2, 0.75, None, 32, 1, "sse"),
)  # fmt: skip

_HELD_OUT: tuple[_Row, ...] = (
    (1, 0.35, None, 32, 1),
    (2, 1.25, None, 32, 1),
    (2, 0.6, "1", 32, 1),
    (1, 0.8, None, 48, 1),
)

# Ten of the training rows, for adding one more machine to the pre-training data in about an hour (the
# whole training set takes hours): the full machine, quotas around every held-out one, both batch sizes.
_TRAINING_SHORT: tuple[_Row, ...] = (
    (1, None, None, 32, 1), (2, None, None, 64, 1),
    (1, 0.25, None, 32, 1), (1, 0.5, None, 32, 1), (2, 1.0, None, 32, 1), (2, 1.5, None, 32, 1),
    (2, 0.5, "0", 32, 1), (2, 0.8, "0", 32, 1), (1, 0.75, None, 64, 1), (1, 0.5, None, 16, 1),
)  # fmt: skip

# Held out of training as well, on the emulated CPUs: a quota and batch size the training rows of that
# kind never had.
_HELD_OUT_ISA: tuple[_Row, ...] = (
    (1, 0.35, None, 48, 1, "avx2"),
    (2, 1.25, None, 32, 1, "sse"),
)


# Four configurations outside the training set with no CFS quota: on a kernel where a quota makes one
# window's time differ from the next by more than ±10 % (docs/design.md, the sixth to eighth VMs), a CPU
# kind can still be tested at full speed, by thread count, core list and a batch size training never had.
_HELD_OUT_FULL: tuple[_Row, ...] = (
    (1, None, None, 24, 1),
    (1, None, None, 48, 1),
    (2, None, None, 48, 1),
    (2, None, "1", 48, 1),
)


def _configs(rows: Sequence[_Row]) -> list[ResourceConfig]:
    def one(row: _Row) -> ResourceConfig:
        t, q, c, b, s, *isa = row
        kind = isa[0] if isa else None
        return ResourceConfig.named(t, cpu_quota=q, cpus=c, batch_size=b, slowdown=s, isa=kind)

    return [one(row) for row in rows]


def training_configs() -> list[ResourceConfig]:
    """The pre-training configurations: 24 on this machine's CPU (as many as the paper's over three
    CPUs) and 8 on two kinds of CPU emulated by their instruction set (:data:`ISAS`)."""
    return _configs(_TRAINING)


def training_short_configs() -> list[ResourceConfig]:
    """Ten of :func:`training_configs` (no emulated CPU), to add a machine of another kind to the
    pre-training data in about an hour (58 min on a 2-core VM)."""
    return _configs(_TRAINING_SHORT)


def held_out_configs() -> list[ResourceConfig]:
    """Four configurations outside the training set (a quota, core list or batch size it never saw),
    for testing the predictor on an unseen device and its adaptation (papers/004 Sec. 4.2, Fig. 8)."""
    return _configs(_HELD_OUT)


def held_out_isa_configs() -> list[ResourceConfig]:
    """Two configurations outside the training set on the emulated CPUs (:data:`ISAS`): a CPU of
    another kind that every machine of this kind can reproduce."""
    return _configs(_HELD_OUT_ISA)


def held_out_full_configs() -> list[ResourceConfig]:
    """Four configurations outside the training set with no CPU quota (threads, a core list, batch sizes
    24 and 48): a CPU kind tested where its quotas are too noisy to test on."""
    return _configs(_HELD_OUT_FULL)


SETS = {
    "training": training_configs,
    "training-short": training_short_configs,
    "heldout": held_out_configs,
    "heldout-isa": held_out_isa_configs,
    "heldout-full": held_out_full_configs,
}


def config_set(name: str) -> list[ResourceConfig]:
    """The configurations of a named set (:data:`SETS`)."""
    if name not in SETS:
        raise ValueError(f"unknown configuration set {name!r}; known: {sorted(SETS)}")
    return SETS[name]()
