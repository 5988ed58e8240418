"""What a run returns and ``--report`` writes (JSON): :class:`RunReport`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunReport:
    """What ``--report`` writes (JSON)."""

    run_id: str
    model: str
    dataset: str
    workers: list[str]
    final_accuracy: float = 0.0
    test_accuracy_per_epoch: list[float] = field(default_factory=list)
    test_loss_per_epoch: list[float] = field(default_factory=list)
    train_loss_per_epoch: list[float] = field(default_factory=list)
    samples_per_second: float = 0.0
    batches: int = 0
    epochs: int = 0
    wall_seconds: float = 0.0
    train_seconds: float = 0.0
    partitions: list[dict[str, Any]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    # --chain-seconds (ResPipe's T in seconds): every retune of the chain period to the measured rate,
    # {"batch", "from_batch", "chain_every", "batch_seconds"}; a plan's own period is in its partition entry.
    chain_periods: list[dict[str, Any]] = field(default_factory=list)
    # Hybrid stages: a replica of a replicated stage died and the others took its rows (no rollback).
    failovers: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "pipeline"
    partition_mode: str = "dynamic"
    # How the split learned device speeds: "predictor" (AccEPT) or "capacity" (FTPipeHD); every h a device
    # announced (at discovery, after a drift) and every adaptive update of the predictor.
    estimator: str = "capacity"
    characterisations: list[dict[str, Any]] = field(default_factory=list)
    adaptations: list[dict[str, Any]] = field(default_factory=list)
    # The pipeline DP's rule among splits with the optimal bottleneck: "latest" or "slack" (--tie-break).
    tie_break: str = "latest"
    in_flight: int = 0
    # How the stages compensated their staleness (pipeline.staleness), the schedule (async or sync) and its
    # micro-batches per update (sync), the momentum.
    staleness: str = "none"
    schedule: str = "async"
    micro_batches: int = 1
    momentum: float = 0.0
    # The rate every stage trained at: --lr, the YAML's, or the default (the rate patch, pipelined_rate, may
    # have lowered a mobilenetv2's).
    learning_rate: float = 0.0
    diverged: str = ""  # why the training loss says the run blew up (pipeline.divergence), "" if it did not
    links: list[dict[str, float]] = field(default_factory=list)
    compression: str = "none"
    compression_ratio: float = 1.0  # uncompressed / sent bytes of stage 0's activation messages (envelope in)
    compression_ratio_tensors: float = 1.0  # the same for the tensors alone (codec parameters in)
    layer_profile: dict[str, Any] = field(default_factory=dict)
    timeline: list[dict[str, float]] = field(default_factory=list)
    # Split-federated training: every epoch's devices, their (P, N), compute and idle time, who was left out.
    splitfed: dict[str, Any] = field(default_factory=dict)
    # Data-parallel training (--mode allreduce): the collective, its timeout, every step's time, members,
    # digests and contributors, and the faults (excluded and joined devices, failed links).
    allreduce: dict[str, Any] = field(default_factory=dict)
    # Every device's time account and bytes as its last metrics said (roles.central.devices), stage 0 first:
    # compute_s, communication_s, idle_s, wall_s, bytes_sent, bytes_received, and in the pipeline
    # modes predicted_stage_s / measured_stage_s (seconds per batch) where the estimator knows both.
    devices: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)
