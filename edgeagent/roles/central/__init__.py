"""The central node (papers/000 Sec. III): the node on the runtime (:mod:`.node`) and the pipeline run's
parts, each a class in a chain over the run context (:mod:`.context`): checkpoint -> handlers -> setup ->
planning -> liveness -> switching -> evaluation -> recovery -> trainer (:class:`PipelineRun`)."""

from edgeagent.roles.central.checkpoint_file import load_checkpoint
from edgeagent.roles.central.context import Fault, Plan
from edgeagent.roles.central.node import Central, ProgressHook
from edgeagent.roles.central.report import RunReport
from edgeagent.roles.central.runs import latest_checkpoint
from edgeagent.roles.central.trainer import PipelineRun

__all__ = [
    "Central",
    "Fault",
    "PipelineRun",
    "Plan",
    "ProgressHook",
    "RunReport",
    "latest_checkpoint",
    "load_checkpoint",
]
