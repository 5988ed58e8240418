"""Helpers shared by the test tiers: an ``Assign`` with every field a test does not care about filled in,
the cluster harness (a central node in this process, its workers as processes), and a fake systemd
notify socket. Fixtures that use them live in tests/conftest.py."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: tests/conftest.py imports this module, which stays torch-free
    from edgeagent.cli.demo import LocalWorkers
    from edgeagent.protocol.messages import Assign
    from edgeagent.protocol.options import TrainOptions
    from edgeagent.roles.central import Central, RunReport

# The progress hook of a run: the values the central node reports, the node, its worker processes.
OnProgress = Callable[[dict[str, Any], "Central", "LocalWorkers"], None]


def unique_cluster() -> str:
    """A fresh cluster name, so concurrent runs on one broker never see each other's topics."""
    return f"t{uuid.uuid4().hex[:8]}"


def make_assign(
    *,
    run_id: str = "run",
    worker_list: list[str] | None = None,
    points: list[int] | None = None,
    model: dict[str, Any] | None = None,
    committed: int = -1,
    options: TrainOptions | None = None,
    batches_per_epoch: int = 1,
    **fields: Any,
) -> Assign:
    """The plan-0 ``Assign`` of a one-worker pipeline (``central``, ``w1``) of one epoch, nothing committed
    yet (``committed`` sets both committed ids); ``fields`` set any other field of the message."""
    from edgeagent.protocol.messages import Assign
    from edgeagent.protocol.options import TrainOptions

    return Assign(
        run_id=run_id,
        plan_id=fields.pop("plan_id", 0),
        worker_list=worker_list if worker_list is not None else ["central", "w1"],
        points=points if points is not None else [0, 1, 2],
        model=model if model is not None else {},
        seed=fields.pop("seed", 0),
        committed_forward_id=committed,
        committed_backward_id=committed,
        status=fields.pop("status", 0),
        options=options or TrainOptions(learning_rate=0.1),
        epochs=fields.pop("epochs", 1),
        batches_per_epoch=batches_per_epoch,
        **fields,
    )


class LocalCluster:
    """A central node to run in this process and its workers as real processes, on ``broker`` under a fresh
    cluster name. ``settings`` are the central node's (``CentralConfig``), ``worker_options`` go to
    ``LocalWorkers`` (kills, links, datasets, allowed_models, extra flags). The workers start before the
    central node connects unless ``start=False`` (then the test starts them, ``self.local.start_all()``).
    ``on_progress`` sees every progress report with the node and the workers, to act at a chosen batch."""

    def __init__(
        self,
        broker: str,
        *,
        workers: int,
        slowdowns: list[float] | None = None,
        on_progress: OnProgress | None = None,
        worker_options: dict[str, Any] | None = None,
        start: bool = True,
        **settings: Any,
    ) -> None:
        from edgeagent.cli.demo import LocalWorkers
        from edgeagent.config import CentralConfig
        from edgeagent.modes import mode
        from edgeagent.roles.central import Central

        self.config = CentralConfig(
            cluster=unique_cluster(), broker=broker, workers=workers, progress=False, **settings
        )
        self.on_progress = on_progress
        self.local = LocalWorkers(
            workers, broker, self.config.cluster, slowdowns or [1.0] * workers, **(worker_options or {})
        )
        if start:
            self.local.start_all()
        try:
            self.node = Central(self.config, progress=self._progress, modes=mode)
        except BaseException:
            self.local.stop()
            raise

    def _progress(self, values: dict[str, Any]) -> None:
        if self.on_progress is not None:
            self.on_progress(values, self.node, self.local)

    def run(self) -> RunReport:
        """Run the central node to its end; the worker processes are stopped whatever happens."""
        try:
            return self.node.run()
        finally:
            self.local.stop()


class FakeSystemd:
    """A datagram socket where systemd would listen; collects what the service says."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue

    def count(self, field: str) -> int:
        return sum(field in m.split("\n") for m in list(self.messages))

    def wait_for(self, field: str, n: int = 1, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count(field) >= n:
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()
