"""The compute clock: the emulated slowdown scales CPU time, and a factor of 1 reads no CPU clock."""

from __future__ import annotations

import threading
import time

import pytest

from edgeagent.runtime.compute import Clock, TimeAccount, emulate_slowdown, emulated_duration


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_factor_one_reads_no_cpu_clock_and_counts_wall_time() -> None:
    clock = Clock(1.0)
    assert clock.cpu is None
    account = TimeAccount()
    duration = emulate_slowdown(clock, 1.0, account)
    assert duration == account.compute
    assert 0.0 <= duration < 1.0
    assert emulated_duration(clock, 1.0) >= duration


def test_slower_device_takes_factor_times_its_cpu_time() -> None:
    clock = Clock(3.0)
    assert clock.cpu is not None
    _burn(0.02)
    duration = emulate_slowdown(clock, 3.0)
    assert duration >= 3 * 0.02 * 0.99
    assert time.perf_counter() - clock.wall >= 3 * 0.02 * 0.99  # it slept the difference


def test_a_clock_started_at_factor_one_is_not_scaled_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slowdown changed within a step (a device profile) takes effect at the next step."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    clock = Clock(1.0)
    _burn(0.01)
    before = time.perf_counter()
    duration = emulate_slowdown(clock, 5.0)
    assert slept == []
    assert before - clock.wall <= duration <= time.perf_counter() - clock.wall


def test_a_send_from_another_thread_counts_its_bytes_not_its_time() -> None:
    """The account's times are its own thread's (they fit in its wall time); another thread's send, which
    overlaps them, adds its bytes only."""
    account = TimeAccount()
    account.sent(100, 0.5)
    other = threading.Thread(target=account.sent, args=(50, 2.0))
    other.start()
    other.join()
    assert account.sent_bytes == 150
    assert account.communication == 0.5
