"""Split-federated pipelined training (PiPar, papers/003): the pure pieces.

``cost`` is the cost model of one training iteration (eq. 5-13 over the stage graph of Sec. 3.2.2)
and eq. 14; ``plan`` the per-device choice of the split point P and the number of mini-batches N, with the
paper's rule and the FL and SFL baselines beside it. ``partition`` splits a data set among devices
(IID or non-IID by label) and writes each device's shard. ``profile`` measures what the plan needs.
``fedavg`` averages complete models (eq. 3) and holds the state-dict helpers the split's halves share.
"""
