"""What a collection records of the machine it ran on (pure reads of /proc and the platform module).

A CPU's brand string says little: every VM here reports "AMD EPYC", whatever its generation. The
predictor's accuracy off the training machine depends on whether a device is of another *kind*, so a
collection records the CPU's identity too: vendor, family, model and stepping on x86 (implementer and
part on ARM) and the widest vector instruction set it offers.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import Any

import torch

# Widest first: the first of these the CPU's flags (x86) or features (ARM) name is recorded.
VECTOR_ISAS = ("amx_tile", "avx512f", "avx2", "avx", "sse4_2", "sve2", "sve", "asimd", "neon")
_IDENTITY_KEYS = (
    "vendor_id", "cpu family", "model", "stepping",  # x86
    "CPU implementer", "CPU part", "CPU variant",  # ARM
)  # fmt: skip


def _first_block(text: str) -> dict[str, str]:
    """The first processor's ``key: value`` lines of /proc/cpuinfo (ARM lists some keys once, after)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key not in fields:
            fields[key] = value.strip()
    return fields


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's brand string from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    fields = _first_block(_read_cpuinfo() if cpuinfo is None else cpuinfo)
    for key in ("model name", "Hardware", "Processor"):
        if fields.get(key):
            return fields[key]
    return platform.processor() or platform.machine()


def cpu_identity(cpuinfo: str | None = None) -> str:
    """E.g. ``"vendor_id=AuthenticAMD cpu family=25 model=17 stepping=1 isa=avx512f"``; ``"unknown"``
    where /proc/cpuinfo cannot be read."""
    fields = _first_block(_read_cpuinfo() if cpuinfo is None else cpuinfo)
    parts = [f"{key}={fields[key]}" for key in _IDENTITY_KEYS if fields.get(key)]
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    isa = next((name for name in VECTOR_ISAS if name in flags), None)
    if isa:
        parts.append(f"isa={isa}")
    return " ".join(parts) or "unknown"


def _read_cpuinfo() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/cpuinfo").read_text()
    return ""


def machine_info() -> dict[str, Any]:
    """The machine as a collection's provenance records it."""
    return {
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpu_id": cpu_identity(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # a TorchVersion: weights_only loads refuse the class
    }


__all__ = ["VECTOR_ISAS", "cpu_identity", "cpu_model", "machine_info"]
