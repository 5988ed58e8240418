"""The pipeline mode's half on a worker: :mod:`.session` runs one stage, :mod:`.run` holds what it knows
about the run, :mod:`.replicas` the stage's replication; :mod:`.hybrid` and :mod:`.hybrid_intake` a stage
held by a group of devices (``--mode hybrid``)."""
