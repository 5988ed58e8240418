"""Which CPU kinds a predictor learned from, and the warning for a device of another kind (pure).

The shipped predictors were trained on data collected on x86-64 VMs only. On a Raspberry Pi (aarch64)
the default ``--estimator predictor`` predicts from ``h`` measured on a CPU it has never seen: it
extrapolates, and its first split may be far off (the drift check re-measures, but only after it).
A predictor file records every collection's machine (``provenance["collections"][i]["machine"]``,
see :mod:`edgeagent.predictor.collect` and :func:`edgeagent.predictor.machine.machine_info`); the kind
compared here is the architecture in its platform string.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from typing import Any

# platform.machine()'s spellings of one kind (Windows and macOS name them differently from Linux).
_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8l": "aarch64", "i386": "i686"}
ARCHES = ("x86_64", "aarch64", "armv7l", "armv6l", "riscv64", "ppc64le", "s390x", "i686")


def cpu_kind(machine: str | None = None) -> str:
    """This machine's CPU kind: its architecture, e.g. ``x86_64`` or ``aarch64``."""
    name = (platform.machine() if machine is None else machine).lower()
    return _ALIASES.get(name, name) or "unknown"


def _kind_of_platform(text: str) -> str | None:
    """The architecture named in a ``platform.platform()`` string (``Linux-6.1.0-...-aarch64-with-...``)."""
    for part in str(text).lower().split("-"):
        kind = _ALIASES.get(part, part)
        if kind in ARCHES:
            return kind
    return None


def learned_kinds(provenance: Mapping[str, Any]) -> set[str]:
    """The CPU kinds a predictor's training data was collected on (empty: not recorded)."""
    machines = [c.get("machine") or {} for c in provenance.get("collections") or () if isinstance(c, Mapping)]
    if not machines:  # an older file: only the machine it was trained on
        machines = [provenance.get("trained_on") or {}]
    kinds = {_kind_of_platform(m.get("platform", "")) for m in machines if isinstance(m, Mapping)}
    return {k for k in kinds if k}


def collect_command(name: str, in_shape: tuple[int, ...], classes: int, kind: str) -> str:
    """The commands that measure a predictor's data on this device and train it."""
    data = f"{name}-{kind}.json"
    shape = "x".join(str(d) for d in in_shape)
    return (
        f"`sudo edgeagent predictor collect --model {name} --in-shape {shape} --classes {classes} "
        f"--out {data}` then `edgeagent predictor train --data {data}`"
    )


def unlearned_kind_warning(
    provenance: Mapping[str, Any],
    *,
    model: str,
    in_shape: tuple[int, ...],
    classes: int,
    kind: str,
    cpu: str,
) -> str | None:
    """One line for a device whose CPU kind the predictor did not learn from, or None (a kind it did, or
    provenance that records none: nothing to compare)."""
    learned = learned_kinds(provenance)
    if not learned or kind in learned:
        return None
    return (
        f"the latency predictor for {model} learned from {', '.join(sorted(learned))} CPUs only; this device "
        f"is {kind} ({cpu}), so its predicted stage times are a guess. Measure data on this device: "
        f"{collect_command(model, in_shape, classes, kind)} (the runs then find it; add the other machines' "
        "--data files to keep them), or plan with --estimator capacity"
    )


__all__ = ["ARCHES", "collect_command", "cpu_kind", "learned_kinds", "unlearned_kind_warning"]
