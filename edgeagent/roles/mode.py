"""The training-mode interface: a mode is a strategy over the one role runtime.

The runtime (:mod:`edgeagent.runtime`) owns the I/O: the transport, the inbox and its limits, handlers
per message type, :meth:`~edgeagent.runtime.role.Role.wait_until`, status, heartbeats, liveness and
metrics. A mode owns what differs between ways of training, in two halves:

* on the central node, :meth:`TrainingMode.start` builds one run over the discovered devices, a
  :class:`CentralRun`; the node drives it (Flower's shape: the node owns the loop around the mode): it
  attaches the run's handlers and metrics, calls its ``execute`` (the mode's own training loop: planning,
  recovery, evaluation) for the :class:`~edgeagent.roles.central.RunReport`, saves its model, and owns
  stop, suspend (SIGTERM: the run's newest checkpoint) and the report's devices; what the
  split-federated and allreduce runs do around their loops is one
  :class:`~edgeagent.roles.central.lifecycle.RunLifecycle`;
* on a worker, :meth:`TrainingMode.worker_session` turns the run's ``Assign`` into a
  :class:`WorkerSession`: the handlers of the mode's data plane, and a ``step`` the worker's loop calls
  whenever the inbox is empty.

The worker routes an ``Assign`` to the mode it names (``Assign.mode``); the central node picks the mode
from ``--mode`` (``pipeline``, FTPipeHD's, by default). Neither imports a mode: both are handed a
:data:`ModeLookup` (the registry's :func:`edgeagent.modes.mode`) by whoever builds them, the CLI. The
interface lives here, with the nodes that drive it, so that the modes (above) import the roles (below)
and never the other way round. A new mode is a new package under :mod:`edgeagent.modes` registered in
:data:`edgeagent.modes.MODES`: it adds files, it does not edit the pipeline's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from edgeagent.data import Dataset
    from edgeagent.models import ModelSpec
    from edgeagent.protocol.messages import Assign, Message
    from edgeagent.runtime.role import Inbound

# The nodes a mode runs on and the run it builds, as type parameters: the interface names no node, so the
# nodes may import it without a circle (the central node ``Central``, the worker ``Worker``, both of
# edgeagent.roles, and the mode's run bind them: ``TrainingMode[Central, Worker, PipelineRun]``).
CentralNode = TypeVar("CentralNode", contravariant=True)
WorkerNode = TypeVar("WorkerNode", contravariant=True)
Run = TypeVar("Run", covariant=True)


class WorkerSession(Protocol):
    """One run of a mode on a worker, from its ``Assign`` until the run ends or leaves this device."""

    run_id: str

    def handlers(self) -> dict[type[Message], Callable[[Inbound], None]]:
        """The data plane's handlers, installed for the run's lifetime over the worker's own."""
        ...

    def has_work(self) -> bool:
        """Whether :meth:`step` would do something now (the worker then does not block on its inbox)."""
        ...

    def step(self) -> None:
        """Do one unit of work (a forward, a backward, an evaluation batch) if one is ready."""
        ...

    def close(self) -> None:
        """The run is over here: unsubscribe, release what the session holds."""
        ...

    def metrics(self) -> dict[str, Any]:
        """What the device publishes on its metrics topic while in this run (docs/protocol.md)."""
        ...

    def profile_changed(self) -> None:
        """The worker applied a new device profile live: adapt what depends on it (a compression
        override, say)."""
        ...


class CentralRun(Protocol):
    """What the central node needs of a mode's run: the handlers of its messages, its metrics, the devices
    it uses (told to stop at the end), its training loop and the trained model."""

    @property
    def worker_list(self) -> list[str]:
        """The run's devices in stage order, the central node first."""
        ...

    def handlers(self) -> dict[type[Message], Callable[[Inbound], None]]: ...

    def metrics(self) -> dict[str, Any] | None: ...

    def collect_weights(self) -> dict[str, Any]: ...

    def execute(self) -> Any:
        """Train over the run's devices to the end: the mode's own loop (its report is returned)."""
        ...

    def save_model(self, path: str) -> bool:
        """``--save-model``: the trained model, gathered from the devices, written to ``path``."""
        ...


class TrainingMode(Protocol[CentralNode, WorkerNode, Run]):
    """A way to train over the runtime; ``name`` is what ``--mode`` and ``Assign.mode`` say."""

    name: ClassVar[str]

    def check(self, spec: ModelSpec, workers: int) -> None:
        """Raise a :class:`~edgeagent.errors.PlanningError` before anything waits if the run cannot work
        (a model too shallow for the devices, say)."""
        ...

    def start(self, central: CentralNode, data: Dataset, spec: ModelSpec, devices: list[str]) -> Run:
        """Build one run on the central node over the discovered ``devices`` (the central node first). The
        node drives it: attaches it (its handlers, its metrics), executes it, saves its model, and owns
        what happens around it (stop, suspend, the report's devices)."""
        ...

    def worker_session(self, worker: WorkerNode, assign: Assign) -> WorkerSession | None:
        """The worker's half of a run; None (after reporting why) when this device cannot take it.

        ``assign`` may re-assign the run the worker is in (a recovery): once the new session can be
        built, it leaves that run (``worker.leave_run()``) before it subscribes to anything.
        """
        ...


# name (``--mode``, ``Assign.mode``) -> its mode: what the CLI hands the nodes (:func:`edgeagent.modes.mode`,
# a :class:`~edgeagent.errors.ConfigError` for an unknown name).
ModeLookup = Callable[[str], TrainingMode[Any, Any, Any]]
