"""A worker's view of its run's central node (edgeagent.roles.worker.central_watch): which statuses end
the run here, and how long an offline central node is waited for."""

from __future__ import annotations

from typing import Any

import pytest

from edgeagent.errors import ProtocolError
from edgeagent.protocol.messages import Heartbeat, Status
from edgeagent.roles.worker.central_watch import CENTRAL_OFFLINE_BEATS, CentralWatch, status_verdict
from tests.helpers import make_assign


def _status(state: str, run_id: str = "", detail: str = "", device: str = "central") -> Status:
    return Status(device_id=device, state=state, run_id=run_id, detail=detail)  # type: ignore[arg-type]


def test_idle_ends_the_run_left_and_another_run_make_the_worker_leave_it() -> None:
    over = status_verdict(_status("idle"), "central", "r1")
    assert over is not None and over.action == "over"
    left = status_verdict(
        _status("left", "r1", "suspended; starting the central node again resumes it"), "central", "r1"
    )
    assert left is not None and left.action == "leave" and "suspended" in left.reason
    other = status_verdict(_status("training", "r2"), "central", "r1")
    assert other is not None and other.action == "leave" and "r2" in other.reason
    # Nothing to do: the same run, a last will (the window's business), another device, another run left.
    assert status_verdict(_status("training", "r1"), "central", "r1") is None
    assert status_verdict(_status("offline"), "central", "r1") is None
    assert status_verdict(_status("idle", device="worker-2"), "central", "r1") is None
    assert status_verdict(_status("left", "r0"), "central", "r1") is None


def test_the_window_is_the_central_nodes_heartbeats_with_a_floor() -> None:
    assert CentralWatch("central", 1.0, 30.0).window == 30.0
    assert CentralWatch("central", 6.0, 30.0).window == CENTRAL_OFFLINE_BEATS * 6.0
    assert CentralWatch("central", 0.0, 5.0).window == 5.0  # not said: the floor


def test_an_offline_central_node_is_waited_for_and_any_sign_of_life_clears_it() -> None:
    watch = CentralWatch("central", 0.5, 2.0)  # window 5 s
    beat = Heartbeat(device_id="central", seq=1)
    watch.arrived("central", _status("offline"), 100.0)
    watch.arrived("central", _status("offline"), 103.0)  # a second will does not restart the clock
    assert watch.expired(104.9) is None
    assert watch.expired(105.0) == pytest.approx(5.0)
    watch.arrived("worker-2", beat, 105.5)  # another device's life is not the central node's
    assert watch.expired(106.0) is not None
    watch.arrived("central", _status("training", "r1"), 106.0)  # back (its status again)
    assert watch.expired(1000.0) is None


def test_after_a_reconnect_the_central_node_must_be_seen_again() -> None:
    watch = CentralWatch("central", 1.0, 3.0)  # window 10 s
    watch.reconnected(50.0)
    assert watch.expired(59.0) is None and watch.expired(60.0) is not None
    watch.arrived("central", _status("training", "r1"), 52.0)  # its retained status, then
    assert watch.expired(60.0) is None


def test_an_assign_says_the_central_nodes_heartbeat_interval_within_bounds() -> None:
    from edgeagent.protocol.options import TrainOptions

    fields: dict[str, Any] = dict(
        run_id="r", worker_list=["central", "w"], points=[0, 1, 2], options=TrainOptions(learning_rate=0.05)
    )
    assert make_assign(**fields, heartbeat_interval=2.0).heartbeat_interval == 2.0
    for bad in (float("nan"), float("inf"), -1.0, 1e9):
        with pytest.raises(ProtocolError, match="heartbeat_interval"):
            make_assign(**fields, heartbeat_interval=bad)
