"""The pipeline mode's half on the central node: the run's parts, each a class in a chain over the run
context (:mod:`.context`): checkpoint -> handlers -> setup -> estimation -> planning -> liveness ->
switching -> evaluation -> recovery -> trainer (:class:`~.trainer.PipelineRun`) -> hybrid
(:class:`~.hybrid.HybridRun`, ``--mode hybrid``)."""
