"""The pipeline mode's half on a worker: :mod:`.session` runs one stage, :mod:`.run` holds what it knows
about the run, :mod:`.replicas` the stage's replication, :mod:`.repartition` its re-splits and
:mod:`.commands` the run's commands (collaborators of the session, which see it as :mod:`.host` says);
:mod:`.hybrid` a stage held by a group of devices (``--mode hybrid``), with its intake
(:mod:`.hybrid_intake`, :mod:`.hybrid_state`), update (:mod:`.hybrid_update`) and failover
(:mod:`.hybrid_failover`). Each step's compute and message is :mod:`edgeagent.pipeline.step`'s."""
