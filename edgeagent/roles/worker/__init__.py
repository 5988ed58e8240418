"""The worker: the device's node (:mod:`.node`), whatever the training mode; per run, the mode's session
(its package under :mod:`edgeagent.modes`) handles the data plane."""

from edgeagent.roles.worker.node import Worker

__all__ = ["Worker"]
