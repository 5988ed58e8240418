"""The pipeline mode's half on the central node: :class:`~.run.PipelineRun` (and :class:`~.run.HybridRun`,
``--mode hybrid``), a run state (:mod:`.context`) and parts held by composition, each in its own module and
holding only the parts below it: setup, estimation, planning, liveness, checkpoint, handlers, switching,
evaluation, recovery, trainer; the hybrid variants in :mod:`.hybrid` and :mod:`.hybrid_feedback`."""
