"""A device's health, read where Linux and the Raspberry Pi firmware expose it: why two Pis differ in speed.

Every device adds :func:`read_health` to its metrics (``values.health``, docs/protocol.md): the CPU's
temperature, its clock, the Pi firmware's throttling flags, the role's memory and what the board has
left. A field the board does not expose is left out (a laptop has no ``get_throttled``; a container may
have no thermal zone), never filled with a guess. Reads are a few small files: cheap enough for every
metrics message. ``vcgencmd`` is the fall-back for throttling on Pi kernels without the sysfs file; it is
looked for once and run at most every :data:`VCGENCMD_EVERY` seconds (it is a process).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

# Bits of the Pi firmware's ``get_throttled`` (the Raspberry Pi documentation of vcgencmd).
THROTTLE_BITS: dict[str, int] = {
    "under_voltage": 0,
    "frequency_capped": 1,
    "throttled": 2,
    "soft_temperature_limit": 3,
    "under_voltage_occurred": 16,
    "frequency_capped_occurred": 17,
    "throttled_occurred": 18,
    "soft_temperature_limit_occurred": 19,
}
FIRMWARE_THROTTLED = "sys/devices/platform/soc/soc:firmware/get_throttled"
VCGENCMD_EVERY = 10.0
# Thermal zone types that are the CPU (Pi: cpu-thermal; x86: x86_pkg_temp; many SoCs: soc-thermal).
_CPU_ZONES = ("cpu", "soc", "x86_pkg")


def throttle_flags(raw: int) -> dict[str, bool]:
    """The named flags of a ``get_throttled`` value (``0x50005``: under-voltage and throttled, now and
    since boot)."""
    return {name: bool(raw >> bit & 1) for name, bit in THROTTLE_BITS.items()}


class HealthReader:
    """Reads the health of the board under ``root`` (``/``; a fake tree in the tests)."""

    def __init__(self, root: str | Path = "/", *, vcgencmd: str | None = "vcgencmd") -> None:
        self.root = Path(root)
        self._vcgencmd = shutil.which(vcgencmd) if vcgencmd else None
        self._vcgencmd_at = -VCGENCMD_EVERY
        self._vcgencmd_value: int | None = None

    def read(self) -> dict[str, Any]:
        """Every field this board has: ``cpu_temp_c``, ``cpu_freq_mhz``, ``throttled_raw`` and
        ``throttling`` (:func:`throttle_flags`), ``rss_mib``, ``mem_available_mib``, ``mem_total_mib``."""
        out: dict[str, Any] = {}
        temp = self.cpu_temperature()
        if temp is not None:
            out["cpu_temp_c"] = round(temp, 1)
        freq = _read_int(self.root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq")
        if freq is not None:
            out["cpu_freq_mhz"] = round(freq / 1000)  # kHz
        raw = self.throttled()
        if raw is not None:
            out["throttled_raw"] = raw
            out["throttling"] = throttle_flags(raw)
        rss = _status_kb(self.root / "proc/self/status", "VmRSS")
        if rss is not None:
            out["rss_mib"] = round(rss / 1024, 1)
        for key, field in (("mem_available_mib", "MemAvailable"), ("mem_total_mib", "MemTotal")):
            kb = _status_kb(self.root / "proc/meminfo", field)
            if kb is not None:
                out[key] = round(kb / 1024, 1)
        return out

    def cpu_temperature(self) -> float | None:
        """Degrees Celsius of the CPU's thermal zone, else the hottest zone; None without any."""
        cpu: list[float] = []
        every: list[float] = []
        for zone in sorted((self.root / "sys/class/thermal").glob("thermal_zone*")):
            milli = _read_int(zone / "temp")
            if milli is None:
                continue
            every.append(milli / 1000)
            kind = _read_text(zone / "type") or ""
            if any(k in kind for k in _CPU_ZONES):
                cpu.append(milli / 1000)
        chosen = cpu or every
        return max(chosen) if chosen else None

    def throttled(self) -> int | None:
        """The firmware's throttling word from sysfs, else from ``vcgencmd get_throttled``; None on boards
        without either."""
        text = _read_text(self.root / FIRMWARE_THROTTLED)
        if text is not None:
            try:
                return int(text, 16)  # the file holds hex digits without 0x ("50005")
            except ValueError:
                return None
        if self._vcgencmd is None:
            return None
        now = time.monotonic()
        if now - self._vcgencmd_at >= VCGENCMD_EVERY:
            self._vcgencmd_at = now
            self._vcgencmd_value = _vcgencmd_throttled(self._vcgencmd)
        return self._vcgencmd_value


def _vcgencmd_throttled(binary: str) -> int | None:
    try:
        out = subprocess.run(
            [binary, "get_throttled"], capture_output=True, text=True, timeout=2, check=True
        ).stdout
        return int(out.strip().partition("=")[2], 16)  # "throttled=0x50005"
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _status_kb(path: Path, field: str) -> int | None:
    """``field`` of a ``/proc`` file in ``Name:   1234 kB`` lines (``status``, ``meminfo``), in kB."""
    text = _read_text(path)
    if text is None:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == field:
            try:
                return int(rest.split()[0])
            except (IndexError, ValueError):
                return None
    return None


_reader: HealthReader | None = None


def read_health() -> dict[str, Any]:
    """This machine's health (one reader per process: ``vcgencmd`` is looked for once)."""
    global _reader
    if _reader is None:
        _reader = HealthReader()
    return _reader.read()
