"""A device's health from a fake sysfs and procfs tree: what a Pi, a laptop and a bare container show."""

from __future__ import annotations

from pathlib import Path

from edgeagent.runtime.health import HealthReader, read_health, throttle_flags


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _pi(root: Path) -> Path:
    _write(root, "sys/class/thermal/thermal_zone0/type", "cpu-thermal\n")
    _write(root, "sys/class/thermal/thermal_zone0/temp", "61234\n")
    _write(root, "sys/class/thermal/thermal_zone1/type", "gpu-thermal\n")  # hotter, not the CPU
    _write(root, "sys/class/thermal/thermal_zone1/temp", "70000\n")
    _write(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq", "1500000\n")
    _write(root, "sys/devices/platform/soc/soc:firmware/get_throttled", "50005\n")
    _write(root, "proc/self/status", "Name:\tpython\nVmRSS:\t  204800 kB\nThreads:\t4\n")
    _write(root, "proc/meminfo", "MemTotal:  949248 kB\nMemFree: 1000 kB\nMemAvailable:  524288 kB\n")
    return root


def test_a_pi_shows_temperature_throttling_and_memory(tmp_path: Path) -> None:
    health = HealthReader(_pi(tmp_path), vcgencmd=None).read()
    assert health == {
        "cpu_temp_c": 61.2,
        "cpu_freq_mhz": 1500,
        "throttled_raw": 0x50005,
        "throttling": {
            "under_voltage": True,
            "frequency_capped": False,
            "throttled": True,
            "soft_temperature_limit": False,
            "under_voltage_occurred": True,
            "frequency_capped_occurred": False,
            "throttled_occurred": True,
            "soft_temperature_limit_occurred": False,
        },
        "rss_mib": 200.0,
        "mem_available_mib": 512.0,
        "mem_total_mib": 927.0,
    }


def test_fields_the_board_lacks_are_left_out(tmp_path: Path) -> None:
    assert HealthReader(tmp_path, vcgencmd=None).read() == {}
    # A board without a CPU-typed zone: the hottest zone; unreadable values are skipped, not guessed.
    _write(tmp_path, "sys/class/thermal/thermal_zone0/temp", "40000\n")
    _write(tmp_path, "sys/class/thermal/thermal_zone1/temp", "45500\n")
    _write(tmp_path, "sys/class/thermal/thermal_zone2/temp", "garbage\n")
    _write(tmp_path, "sys/devices/platform/soc/soc:firmware/get_throttled", "not hex\n")
    _write(tmp_path, "proc/meminfo", "MemTotal: 1024 kB\n")
    assert HealthReader(tmp_path, vcgencmd=None).read() == {"cpu_temp_c": 45.5, "mem_total_mib": 1.0}


def test_vcgencmd_is_the_fallback_for_throttling(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "vcgencmd"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho throttled=0x4\n")
    fake.chmod(0o755)
    reader = HealthReader(tmp_path / "root", vcgencmd=str(fake))
    assert reader.read() == {"throttled_raw": 4, "throttling": throttle_flags(4)}
    assert throttle_flags(4)["throttled"] and not throttle_flags(4)["under_voltage"]


def test_this_machine_has_at_least_its_memory() -> None:
    health = read_health()
    assert health["rss_mib"] > 0 and health["mem_available_mib"] > 0
