"""``edgeagent monitor``: a live terminal dashboard of one cluster or of every cluster on a broker.

* :mod:`.state`: :class:`ClusterState` folds the JSON messages a cluster publishes (statuses, heartbeats,
  metrics, announcements, error reports and run events) into a view. Pure: no I/O, no threads.
* :mod:`.view`: draws that view with rich (:func:`~.view.render`).
* :mod:`.summary`: one line per run event (:func:`summarize`).
* :mod:`.live`: :func:`run_monitor` connects to the broker, feeds every payload into a ``ClusterState``
  on paho's network thread (under a lock) and redraws it with :class:`rich.live.Live` until Ctrl-C.

A device that shuts down cleanly publishes the retained state ``left``; that is not a problem, so such
a device never makes its cluster look alive and never shows a late heartbeat. A device seen leaving
while the monitor watches stays in the table, dimmed, for :data:`LEFT_GRACE` seconds and is then
hidden; one that had left before the monitor started (a retained ``left``) is hidden at once. The
footer counts them; ``show_left`` (``edgeagent monitor --show-left``) lists them all. A cluster all of
whose devices have left is finished: like a dormant one, its run panel is no longer shown.

Names with a leading underscore are shared between the package's modules, not part of its API.
"""

from edgeagent.ops.monitor.live import CONNECT_TIMEOUT, run_monitor
from edgeagent.ops.monitor.state import (
    LEFT_GRACE,
    ClusterState,
    DeviceView,
    EventLine,
    RunView,
    subscriptions,
)
from edgeagent.ops.monitor.summary import summarize

__all__ = [
    "CONNECT_TIMEOUT",
    "LEFT_GRACE",
    "ClusterState",
    "DeviceView",
    "EventLine",
    "RunView",
    "run_monitor",
    "subscriptions",
    "summarize",
]
