"""The central node (papers/000 Sec. III) as every training mode shares it: the node on the runtime
(:mod:`.node`: discovery, liveness stamped on arrival, status, stop), the run's files (:mod:`.runs`,
:mod:`.checkpoint_file`) and the report's common fields (:mod:`.report`). A mode's own half of the run
lives in its package under :mod:`edgeagent.modes`."""

from edgeagent.roles.central.checkpoint_file import load_checkpoint
from edgeagent.roles.central.node import Central, ProgressHook
from edgeagent.roles.central.report import RunReport
from edgeagent.roles.central.runs import latest_checkpoint

__all__ = [
    "Central",
    "ProgressHook",
    "RunReport",
    "latest_checkpoint",
    "load_checkpoint",
]
