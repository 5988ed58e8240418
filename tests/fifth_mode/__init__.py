"""A trivial fifth training mode, for tests/unit/test_fifth_mode.py: a package of its own and nothing else.

What a new mode is (docs/design.md): its :class:`~edgeagent.roles.mode.TrainingMode` here, its central
half (:class:`FifthRun`, which the node drives), its worker half (:class:`FifthSession`) and its messages
(:mod:`.messages`); the test registers it with one :class:`~edgeagent.mode_names.ModeEntry` and edits no
file of edgeagent. Its central half greets every worker once and ends: the node does the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from edgeagent.data import Dataset
from edgeagent.models import ModelSpec
from edgeagent.protocol.messages import Assign, Message
from edgeagent.protocol.topics import Family
from edgeagent.roles.central import Central, RunReport
from edgeagent.roles.worker import Worker
from edgeagent.runtime.role import Inbound
from tests.fifth_mode.messages import Hello


class FifthSession:
    """The worker's half: it takes :class:`Hello` messages and counts them."""

    def __init__(self, worker: Worker, assign: Assign) -> None:
        self.worker = worker
        self.run_id = assign.run_id
        self.hellos: list[Hello] = []
        self.closed = False

    def handlers(self) -> dict[type[Message], Callable[[Inbound], None]]:
        return {Hello: self._on_hello}

    def _on_hello(self, item: Inbound) -> None:
        assert isinstance(item.message, Hello)
        self.hellos.append(item.message)

    def has_work(self) -> bool:
        return False

    def step(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def metrics(self) -> dict[str, Any]:
        return {"hellos": len(self.hellos)}

    def profile_changed(self) -> None:
        pass


class FifthRun:
    """The central half: a ``Hello`` to every worker, then a report. The node attaches it, executes it and
    saves its model (``Central._drive``)."""

    def __init__(self, central: Central, spec: ModelSpec, devices: list[str]) -> None:
        self.central = central
        self.spec = spec
        self.worker_list = devices
        self.saved: list[str] = []

    def handlers(self) -> dict[type[Message], Callable[[Inbound], None]]:
        return {}

    def metrics(self) -> dict[str, Any] | None:
        return {"greeted": len(self.worker_list) - 1}

    def collect_weights(self) -> dict[str, Any]:
        return {}

    def execute(self) -> RunReport:
        for device in self.worker_list[1:]:
            hello = Hello(run_id=self.central.run_id, text=f"hello {device}")
            self.central.send(self.central.topics.device(Family.CONTROL, device), hello)
        workers = self.worker_list[1:]
        return RunReport(run_id=self.central.run_id, model=self.spec.name, dataset="", workers=workers)

    def save_model(self, path: str) -> bool:
        self.saved.append(path)
        return True


class FifthMode:
    """The mode's face: the central half's run, a worker session per Assign."""

    name: ClassVar[str] = "fifth"

    def check(self, spec: ModelSpec, workers: int) -> None:
        pass

    def start(self, central: Central, data: Dataset, spec: ModelSpec, devices: list[str]) -> FifthRun:
        return FifthRun(central, spec, devices)

    def worker_session(self, worker: Worker, assign: Assign) -> FifthSession:
        return FifthSession(worker, assign)
