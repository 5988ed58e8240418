"""Data-parallel training's collectives (``--mode allreduce``): the thesis's fault-tolerant tree allreduce
(papers/001) and its baselines, as pure state machines (:mod:`edgeagent.allreduce.base`)."""
