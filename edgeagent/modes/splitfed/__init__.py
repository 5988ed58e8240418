"""Split-federated pipelined training (PiPar, papers/003) as a training mode: ``--mode split-federated``.

Each worker is a device with its own data (``edgeagent worker --dataset FILE.npz``); the central node is
the server and keeps only a test set. Device ``k`` runs layers ``[0, P_k)`` on ``N_k`` mini-batches per
iteration and updates once per iteration (Algorithm 1); the server keeps one server-side model per device,
answers every mini-batch with its gradient as soon as it is done (Algorithm 2), and averages the complete
models with FedAvg weighted by ``|D_k|`` at every epoch's end (eq. 3). Raw inputs never leave a device
(``P >= 1``); ``P = L`` is FL, the baseline, in the same code.

The central node's half is :class:`~edgeagent.modes.splitfed.central.SplitFedRun`, the worker's
:class:`~edgeagent.modes.splitfed.worker.SplitFedSession`; both are imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from edgeagent.config import CentralConfig
    from edgeagent.data import Dataset
    from edgeagent.models import ModelSpec
    from edgeagent.modes.splitfed.central import SplitFedRun
    from edgeagent.protocol.messages import Assign
    from edgeagent.roles.central import Central
    from edgeagent.roles.mode import WorkerSession
    from edgeagent.roles.worker import Worker


def write_demo_shards(config: CentralConfig, workers: int, folder: str) -> list[str]:
    """``edgeagent demo``: the run's training set split among ``workers`` devices (``config.split``: IID or
    non-IID by label), one ``.npz`` each in ``folder``; the central node keeps the test set."""
    from edgeagent.data import load_dataset
    from edgeagent.splitfed.partition import partition, write_shards

    train = config.train
    data = load_dataset(train.dataset, seed=train.seed, test_fraction=train.test_fraction)
    x, y = data.x_train.numpy(), data.y_train.numpy()
    parts = partition(x, y, workers, config.split, train.seed)
    return [str(p) for p in write_shards(x, y, parts, folder, prefix="worker-")]


class SplitFedMode:
    """The devices keep their data; layers [0, P_k) on device k, the rest on the server (module doc)."""

    name: ClassVar[str] = "split-federated"

    def check(self, spec: ModelSpec, workers: int) -> None:
        """At least one device (the data is on the devices) and a model of at least one layer."""
        from edgeagent.errors import PlanningError

        if workers < 1:
            raise PlanningError(
                "split-federated training needs at least 1 worker: the training data is on the devices "
                "(--workers, and each worker's --dataset)"
            )

    def start(self, central: Central, data: Dataset, spec: ModelSpec, devices: list[str]) -> SplitFedRun:
        from edgeagent.modes.splitfed.central import SplitFedRun

        return SplitFedRun(central, data, spec, devices)

    def worker_session(self, worker: Worker, assign: Assign) -> WorkerSession | None:
        from edgeagent.modes.splitfed.worker import SplitFedSession

        return SplitFedSession.open(worker, assign)


__all__ = ["SplitFedMode", "write_demo_shards"]
