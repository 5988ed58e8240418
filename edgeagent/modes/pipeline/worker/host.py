"""What the collaborators of a worker's pipeline session need of it (:mod:`.commands`, :mod:`.repartition`,
and the hybrid member's :mod:`.hybrid_intake`, :mod:`.hybrid_update`, :mod:`.hybrid_failover`).

The session holds them; they hold the session only as one of these small protocols, so that each can be
read (and tested) without the rest of the session, and no module imports the session's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from edgeagent.modes.pipeline.worker.hybrid_state import HybridState
from edgeagent.modes.pipeline.worker.replicas import Replicas
from edgeagent.modes.pipeline.worker.run import Run
from edgeagent.pipeline.rows import Rows
from edgeagent.protocol.identity import PlanView

if TYPE_CHECKING:
    from edgeagent.roles.worker.node import Worker


class SessionHost(Protocol):
    """A pipeline session as its collaborators see it: the device, the run, its weight store."""

    @property
    def worker(self) -> Worker: ...

    @property
    def run(self) -> Run: ...

    @property
    def replicas(self) -> Replicas: ...

    def end(self, *, rejoin: bool = False) -> None:
        """The run is over here: its figures in the log, then leave (rejoin: announce again)."""
        ...

    def subscribe_stage(self) -> None:
        """Listen to the current stage's topics (after its plan or its group changed)."""
        ...

    def has_work(self) -> bool:
        """Whether a training or evaluation pass can run now."""
        ...

    def step(self) -> None:
        """Run the next pass (1F1B's order)."""
        ...


class HybridHost(SessionHost, Protocol):
    """A hybrid stage member's session as its collaborators see it: also its group and its rows."""

    @property
    def hy(self) -> HybridState: ...

    @property
    def group(self) -> tuple[str, ...]:
        """The devices holding this member's stage, the primary first."""
        ...

    @property
    def is_primary(self) -> bool: ...

    def my_rows(self, total: int) -> Rows:
        """This member's rows of a batch of ``total``, under the current shares."""
        ...

    def plan_view(self) -> PlanView: ...


__all__ = ["HybridHost", "SessionHost"]
