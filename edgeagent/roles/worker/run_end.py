"""How a run ends on a worker, for the sessions that share it (split-federated, allreduce): the run's
``stop``, or its central node's status (:func:`~edgeagent.roles.worker.central_watch.status_verdict`:
an idle central node ends the run; one that left it, suspended, or trains another run makes this device
leave it and announce itself idle, so that it can join again). Either way the worker's final figures
go out and it leaves the run (:meth:`Worker.end_run`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from edgeagent.protocol.commands import Stop
from edgeagent.protocol.messages import Message, Status
from edgeagent.roles.worker.central_watch import Verdict
from edgeagent.runtime.intake import Inbound

log = logging.getLogger("edgeagent.roles.worker.node")


class EndOwner(Protocol):
    """What the end of a run needs of the worker."""

    device_id: str

    def central_status(self, msg: Status, central: str, run_id: str) -> Verdict | None: ...

    def end_run(self, *, rejoin: bool = False) -> None: ...


class RunEnd:
    """The end of run ``run_id``, driven by ``central`` (see the module doc); ``summary()`` says what the
    run did here, for the log line (``split-federated run R over after 3 epochs``)."""

    def __init__(self, worker: EndOwner, run_id: str, central: str, summary: Callable[[], str]) -> None:
        self.worker = worker
        self.run_id = run_id
        self.central = central
        self.summary = summary

    def handlers(self) -> dict[type[Message], Callable[[Inbound], None]]:
        return {Stop: self.on_stop, Status: self.on_status}

    def on_stop(self, item: Inbound) -> None:
        msg = item.message
        if isinstance(msg, Stop) and msg.run_id == self.run_id:
            self.end()

    def on_status(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Status)
        verdict = self.worker.central_status(msg, self.central, self.run_id)
        if verdict is not None:
            self.end(rejoin=verdict.action == "leave")

    def end(self, *, rejoin: bool = False) -> None:
        """Over here (``rejoin``: the run goes on without this device, which announces itself idle)."""
        log.info("%s: %s", self.worker.device_id, self.summary())
        self.worker.end_run(rejoin=rejoin)


__all__ = ["EndOwner", "RunEnd"]
