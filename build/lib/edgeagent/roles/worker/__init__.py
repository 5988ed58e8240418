"""The worker: the device's node (:mod:`.node`) and, per run, the training mode's session; for the
pipeline mode :mod:`.session` runs one stage and :mod:`.run` holds what it knows about the run."""

from edgeagent.roles.worker.node import Worker
from edgeagent.roles.worker.run import stage_input

__all__ = ["Worker", "stage_input"]
