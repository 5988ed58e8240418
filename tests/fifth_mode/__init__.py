"""A trivial fifth training mode, for tests/unit/test_fifth_mode.py: a package of its own and nothing else.

What a new mode is (docs/design.md): its :class:`~edgeagent.roles.mode.TrainingMode` here, its worker half
(:class:`FifthSession`) and its messages (:mod:`.messages`); the test registers it with one
:class:`~edgeagent.mode_names.ModeEntry` and edits no file of edgeagent. Its central half does nothing: it
is never run (no process is spawned by a unit test).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from edgeagent.models import ModelSpec
from edgeagent.protocol.messages import Assign, Message
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


class FifthMode:
    """The mode's face: a worker session per Assign; no central run (a unit test never starts one)."""

    name: ClassVar[str] = "fifth"

    def check(self, spec: ModelSpec, workers: int) -> None:
        pass

    def start(self, central: Any, data: Any, spec: ModelSpec, devices: list[str]) -> Any:
        raise NotImplementedError("the fifth mode has no central half: it exists for a unit test")

    def worker_session(self, worker: Worker, assign: Assign) -> FifthSession:
        return FifthSession(worker, assign)
