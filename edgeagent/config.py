"""Typed, validated configuration: YAML files in, frozen models out, validated once at the boundary.

Command-line flags override the YAML values. Errors name the file, the key and what is allowed.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import WithJsonSchema
from pydantic_core import PydanticCustomError

from edgeagent.errors import ConfigError
from edgeagent.injected import parse_send_nan
from edgeagent.mode_names import DEFAULT_MODE, MODES, applies_to, mode_keys, mode_names
from edgeagent.pipeline.staleness import DEFAULT_STALENESS, Staleness

# h and the tiles from the fastest of two windows, not one: the held-out sets' windows, used as a device's
# inputs one and two at a time against the times of other windows, give blended+8 within ±10 % for 68.8 %
# and 86.4 % of sub-models on the quietest machine (bench/predictor.py, "as a device measures").
CHARACTERISE_ROUNDS = 2


# The per-model, per-depth rate patch of 2026-11-27/28, kept as an option to compare against
# (``TrainConfig.pipelined_rate``): before staleness compensation a pipelined MobileNetV2 diverged at 0.05
# (docs/design.md, "Staleness compensation"), so a run that set no rate took 0.02, scaled by 3 over its
# staleness beyond 4 stages (staleness-aware SGD). With the default compensation a run trains at the rate
# a single device would use.
PIPELINED_LEARNING_RATES: dict[str, float] = {"mobilenetv2": 0.02}
PIPELINED_RATE_STALENESS = 3


def staleness_scaled(rate: float, in_flight: int) -> float:
    """A pipelined rate for ``in_flight`` batches in flight (gradients ``in_flight - 1`` updates old): as it
    is up to :data:`PIPELINED_RATE_STALENESS`, scaled down in proportion beyond (staleness-aware SGD)."""
    stale = in_flight - 1
    return rate if stale <= PIPELINED_RATE_STALENESS else rate * PIPELINED_RATE_STALENESS / stale


def pipelined_learning_rate(model: str, mode: str, in_flight: int) -> float | None:
    """The learning rate a run of ``model`` takes under ``pipelined_rate`` when it sets none, or None for
    TrainConfig's default: only asynchronous runs (pipeline and hybrid modes with more than one batch in
    flight; :attr:`~edgeagent.mode_names.ModeEntry.stale` in the registry) are stale."""
    entry = MODES.get(mode)
    if entry is None or not entry.stale or in_flight == 1:
        return None
    return PIPELINED_LEARNING_RATES.get(model)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TrainConfig(_Frozen):
    """What to train and how; every stage of a run shares these."""

    model: str = "mlp"
    model_options: dict[str, Any] = Field(default_factory=dict)
    dataset: str = "digits"
    test_fraction: float = Field(0.2, gt=0, lt=1)
    epochs: int = Field(5, ge=1)
    batch_size: int = Field(32, ge=1)
    eval_batch_size: int = Field(256, ge=1)
    # What a single device would train with: the pipeline compensates its staleness (``staleness``).
    learning_rate: float = Field(0.05, gt=0)
    # constant, or cosine: from learning_rate down to 0 over the run's batches (pipeline.sgd.rate_factor);
    # step: times lr_gamma at the start of each epoch in lr_milestones (torch's MultiStepLR). A run with
    # milestones takes AccEPT's adaptive bit widths from them (compression.schedule.stage_bits).
    lr_schedule: Literal["constant", "cosine", "step"] = "constant"
    lr_milestones: tuple[int, ...] = ()
    lr_gamma: float = Field(0.1, gt=0, le=1)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(4e-5, ge=0)
    seed: int = 0
    # Batches between forward and backward on stage 0; 0 means "the number of stages" (PipeDream's NOAM).
    in_flight: int = Field(0, ge=0)
    # How each stage compensates the staleness of its gradients (edgeagent.pipeline.staleness): lookahead
    # (ours), predict, nesterov, 2bw; none and aggregate are FTPipeHD's (vertical sync, without and with its
    # weight aggregation).
    staleness: Staleness = DEFAULT_STALENESS
    aggregation_interval: int = Field(1, ge=1)
    # async: the asynchronous pipeline; sync: micro_batches micro-batches per update and a flush, exact
    # SGD with a bubble (PipeDream-flush, GPipe), the baseline every compensation is measured against.
    schedule: Literal["async", "sync"] = "async"
    micro_batches: int = Field(0, ge=0, description="sync schedule: micro-batches per batch; 0: the stages")
    # The per-model rate patch of earlier versions, to compare: a pipelined MobileNetV2 that sets no rate
    # takes 0.02, scaled by 3 over its staleness beyond 4 stages (PIPELINED_LEARNING_RATES).
    pipelined_rate: bool = False
    # A run whose epoch's mean training loss is not finite or above chance's has diverged
    # (pipeline.divergence): stop it with one line saying what to change, or warn and go on (benchmarks).
    divergence: Literal["stop", "warn"] = "stop"
    # Stop after this many training batches in all (tests and benchmarks); None: run every epoch.
    max_batches: int | None = Field(None, ge=1)
    # Pre-trained weights for continuous learning (a state_dict file of the whole model).
    init_weights: str | None = None

    @model_validator(mode="after")
    def _milestones(self) -> TrainConfig:
        """``step`` needs milestones, increasing epochs inside the run; other schedules take none."""
        ms = self.lr_milestones
        if self.lr_schedule != "step":
            if ms:
                raise ValueError(f"lr_milestones {list(ms)} need lr_schedule: step (got {self.lr_schedule})")
            return self
        if not ms or ms[0] < 1 or ms[-1] >= self.epochs or any(b <= a for a, b in itertools.pairwise(ms)):
            raise ValueError(
                f"lr_schedule step needs lr_milestones: increasing epochs in 1..{self.epochs - 1} "
                f"(epochs {self.epochs}), got {list(ms)}"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _aggregation_alias(cls, data: Any) -> Any:
        """``aggregation: true|false`` (before 2026-11-29) is ``staleness: aggregate|none``."""
        if isinstance(data, dict) and "aggregation" in data:
            data = dict(data)
            flag = data.pop("aggregation")
            if "staleness" not in data and isinstance(flag, bool):
                data["staleness"] = "aggregate" if flag else "none"
            elif not isinstance(flag, bool):
                data["aggregation"] = flag  # extra key: validation names it
        return data


PartitionMode = Literal["uniform", "dynamic", "oracle"]


def _known_mode(name: Any) -> Any:
    """A registered training mode's name (:data:`edgeagent.mode_names.MODES`, read at validation: a mode
    registered at run time is accepted too). Refused in pydantic's words for a ``Literal``, as when the
    names were one."""
    if not isinstance(name, str) or name not in MODES:
        quoted = [repr(n) for n in mode_names()]
        expected = " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
    return name


# The training mode's name: any registered mode; the JSON Schema lists them (docs/schema, editors).
TrainingModeName = Annotated[
    str,
    BeforeValidator(_known_mode),
    WithJsonSchema({"enum": list(mode_names()), "type": "string"}),
]
CollectiveName = Literal["ft-tree", "ft-tree-thesis", "tree", "ring", "ps-sync", "ps-async", "direct"]
# Split-federated training: how each device's (split point, parallel mini-batches) is chosen, from the
# profiled estimate (PiPar Sec. 3.3): ours (per device), paper (the paper's rule), common (the best one for
# all); fl: the whole model on the devices; sfl: the best split with one mini-batch; fixed: --split-point
# and --parallel-batches as given.
SplitFedPlan = Literal["ours", "paper", "common", "fl", "sfl", "fixed", "exhaustive"]


class BrokerAccess(_Frozen):
    """How a role reaches the broker: its URL, its login and TLS files."""

    broker: str = "mqtt://127.0.0.1:1883"
    # The login; default: the device id (what `edgeagent credentials add <id>` creates).
    username: str | None = None
    # A file holding the password (mode 0600; a relative name is also looked up in systemd's
    # $CREDENTIALS_DIRECTORY, for LoadCredential=).
    password_file: str | None = None
    ca_file: str | None = Field(None, description="CA that signed the broker's certificate (mqtts://)")
    cert_file: str | None = Field(None, description="this device's client certificate (mutual TLS)")
    key_file: str | None = Field(None, description="the key of cert_file")
    # Send the password over plain mqtt:// to a broker beyond loopback anyway (refused without it: anyone
    # on the network would read it); logged as a warning. Use mqtts:// with ca_file instead.
    insecure_plaintext: bool = False


class CentralConfig(BrokerAccess):
    cluster: str = "default"
    device_id: str = "central"
    workers: int = Field(2, ge=0)
    threads: int = Field(1, ge=1)
    slowdown: float = Field(1.0, ge=1.0)
    link_mbps: float = Field(0.0, ge=0, description="emulated uplink of the central node; 0: real link")
    heartbeat_interval: float = Field(1.0, gt=0)
    metrics_interval: float = Field(1.0, ge=0, description="seconds between metrics messages; 0: none")
    # Home Assistant MQTT discovery of every device's training status (off by default).
    home_assistant: bool = False
    home_assistant_prefix: str = "homeassistant"
    # Prometheus: serve every device's last metrics on http://<host>:<port>/metrics (off by default).
    prometheus_port: int | None = Field(None, ge=1, le=65535, description="Prometheus endpoint; none: off")
    startup_timeout: float = Field(60.0, gt=0)
    # Deadlines (Sec. III-F's batch timer, the evaluation, the probe after a fault) are derived from what
    # was measured: the predicted time of the work outstanding times ``timeout_multiplier``, never less
    # than their floor. A Pi is 10-50x slower than a laptop: no fixed value fits both.
    timeout_multiplier: float = Field(4.0, ge=1.0, description="deadline = multiplier x predicted time")
    batch_timeout: float = Field(10.0, gt=0, description="floor of the batch timer and evaluation deadline")
    probe_timeout: float = Field(1.0, gt=0, description="floor of the window for answers to the probe")
    # Until a device has run a batch its speed is unknown: assume it this many times slower than the
    # central node (a Pi against a laptop; times the emulated slowdown it announces).
    unmeasured_slowdown: float = Field(50.0, ge=1.0)
    # After a fault, how long a missing device may take to come back with its id (recovery case 2): a
    # systemd restart plus Python and torch start-up on a Pi. 0: recover without waiting (case 3).
    restart_window: float = Field(30.0, ge=0)
    report: str | None = None
    save_model: str | None = None
    progress: bool = True
    # The training mode (edgeagent.modes): pipeline is FTPipeHD's asynchronous pipeline; hybrid lets several
    # devices hold one stage (data parallelism inside the pipeline), planned by planner.hybrid.
    mode: TrainingModeName = DEFAULT_MODE
    # Split-federated (PiPar): the plan of every device's (P, N); explicit values override it for all.
    splitfed_plan: SplitFedPlan = "ours"
    split_point: int | None = Field(None, ge=1, description="split-federated: device layers [0, P)")
    parallel_batches: int | None = Field(None, ge=1, description="split-federated: mini-batches N")
    # --splitfed-plan exhaustive (the paper's baseline of eq. 28): every common (P, N), N up to this
    # (None: the batch size), trained for exhaustive_iterations iterations before the run proper.
    exhaustive_max_n: int | None = Field(None, ge=1, description="exhaustive search: the largest N tried")
    exhaustive_iterations: int = Field(1, ge=1, description="exhaustive search: iterations per (P, N)")
    # --splitfed-plan ours: devices whose profiled compute and links are within this (relative) of one
    # another are planned on their mean and take one (P, N) (splitfed.similar); 0: each on its own.
    splitfed_similar: float = Field(0.3, ge=0.0, description="split-federated: alike within this share")
    # --splitfed-plan ours: the first epoch runs each device's chosen N and smaller ones in turn (its
    # iterations are real training) and the fastest measured is kept (splitfed.trial); False: the
    # estimate's N throughout, as the paper.
    splitfed_trial: bool = Field(True, description="split-federated: try N around the estimate's")
    # The server-side models (one per device) run in parallel on this many threads, each device's
    # mini-batches still one at a time in arrival order (PiPar Fig. 3(c); splitfed.server); 1: one after
    # another on the central node's thread (Fig. 3(b)); 0: from the cores and torch's threads.
    splitfed_server_threads: int = Field(0, ge=0, description="split-federated: server-side threads")
    # Data-parallel training (--mode allreduce): the collective (ft-tree: papers/001's fault-tolerant tree;
    # tree, ring; ps-sync, ps-async: the parameter server on the central node; direct: all-to-all), the
    # timeout of its backup path (None: adaptive, from each link's measured round trips, at least
    # allreduce_timeout_floor), injected link failures ("A,B@FROM:TO") and how the data is split.
    collective: CollectiveName = "ft-tree"
    allreduce_timeout: float | None = Field(None, gt=0, description="fixed timeout (s); None: adaptive")
    allreduce_timeout_floor: float = Field(0.02, gt=0, description="adaptive timeouts: the least (s)")
    fail_links: list[str] = Field(default_factory=list)
    split: Literal["iid", "noniid"] = "iid"
    # Hybrid stages: the most devices one stage may have (None: no bound).
    max_replicas: int | None = Field(None, ge=1)
    # Stage 0 may be the central node plus helpers it sends every batch's input rows to, where the hybrid
    # DP predicts it faster (False: the central node holds stage 0 alone).
    # Off by default: it pays only where the central node is the bottleneck, and on noisy measurements
    # the DP gives stage 0 a helper with a small share and takes it away again. (The re-split hang it
    # showed, a worker crashing as it moved into stage 0 and then waited for for ever, is fixed.)
    replicate_first: bool = Field(False, description="hybrid: stage 0 may have helpers fed with input rows")
    # uniform: PipeDream's even split, never changes; dynamic: FTPipeHD (re-split from measurements);
    # oracle: the DP fed the true slowdowns, the limit to measure against.
    partition: PartitionMode = "dynamic"
    # How the split learns a device's speed: AccEPT's latency predictor (papers/004 Sec. 3.2; every device
    # characterised when it joins, re-measured when a stage time drifts beyond epsilon) or FTPipeHD's
    # capacity estimate (papers/000 eq. 1-3), the baseline. A model without a trained predictor falls back
    # to capacity (with a log line saying how to build one).
    estimator: Literal["predictor", "capacity"] = "predictor"
    epsilon: float = Field(0.1, gt=0, le=10, description="drift share that triggers a new h")
    # When a stage time off its prediction by epsilon asks the device for a new h (predictor.tracker):
    # paper, whenever it is; changed (ours), only if it also moved by epsilon from the device's last time
    # on that range (a standing gap is the predictor's error), and a gross standing gap (2x or more off
    # the prediction) rescales that device's predicted times to the measured one and re-plans
    # (DeviceTimes.close_gaps), then checks the new split soon after; rescale (ours, opt-in): changed, and
    # every standing gap beyond epsilon is rescaled. Under real CPU quotas rescale re-planned at every
    # check on the pipeline's contention (0.61-0.86x changed's samples/s): docs/design.md.
    drift_rule: Literal["paper", "changed", "rescale"] = "changed"
    # Correction of the predictor from the tiling each worker measures with its h
    # (edgeagent.predictor.correction; ours): linear, the tiles and h in one linear fit (a speed per tile,
    # an overhead per sub-model; the predictor shares a tile among its layers); blend, the per-layer
    # correction and the tiles taken as additive weighed by h (the default until 2026-11-28); tiles, the
    # per-layer correction alone; none: the predictor as the paper has it.
    correction: Literal["linear", "blend", "tiles", "none"] = "linear"
    # Which split the pipeline DP takes among those with the optimal bottleneck T* (planner/dp.py): latest,
    # FTPipeHD's rule (the latest cuts: early stages fill up to T* whatever their speed), or slack (the
    # least sum of stage times among the splits within T* x (1 + tie_tolerance): a slow device keeps as
    # few layers as that allows, which costs less when predicted times are off). None: slack when the
    # latency predictor plans, latest otherwise (the capacity estimate, oracle and uniform baselines).
    tie_break: Literal["latest", "slack"] | None = None
    tie_tolerance: float = Field(
        0.02, ge=0, le=1, allow_inf_nan=False, description="slack: share of T* a split may exceed it by"
    )
    repartition_first: int = Field(10, ge=1, description="batches of epoch 0 before the first re-split")
    repartition_every: int = Field(100, ge=1, description="batches between later re-splits")
    # Replication (papers/000 Sec. III-E) and recovery (Sec. III-F). respipe: the next worker takes over
    # a dead worker's layers and nothing is re-split (papers/002), the baseline.
    recovery: Literal["ftpipehd", "respipe"] = "ftpipehd"
    # After one dead worker: resume (its layers from its newest replica, only its lost batches replayed
    # from its neighbours' logs, nobody else goes back) or rollback (every stage back to that replica's
    # version, every batch since replayed: the behaviour before 2026-11-29, the baseline).
    recovery_mode: Literal["resume", "rollback"] = "resume"
    chain_every: int = Field(50, ge=0, description="batches between chain replications (0: off)")
    # ResPipe's period T in seconds instead (papers/002 Sec. 4.2: "every T time units", T = 30 s in its
    # testbed): the central node turns it into batches (replication.period), from the planned step at
    # the start and the measured commit rate at every re-split and recovery. None: chain_every.
    chain_seconds: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="seconds between chain replications (ResPipe's T), instead of chain_every",
    )
    global_every: int = Field(100, ge=0, description="batches between global replications (0: off)")
    replicas: int = Field(1, ge=1, description="chain successors that hold a replica (ResPipe's z)")
    # How replicas cross an emulated slow uplink (--link-mbps): in its idle time, at most this share of
    # it (a newer replica replaces one still waiting); 0: as the paper, at once, ahead of activations.
    replica_share: float = Field(
        0.25, ge=0, le=1, description="share of a slow uplink replicas may take in its idle time (0: at once)"
    )
    # A real uplink (no --link-mbps) is slow when the link probes measure it below this: its replicas are
    # paced then as an emulated one's (PaceReplicas). 0: only emulated uplinks are paced.
    replica_pace_mbps: float = Field(
        10.0,
        ge=0,
        allow_inf_nan=False,
        description="pace the replicas of a worker whose measured uplink is below this many Mbit/s (0: off)",
    )
    # The central node's checkpoints (edgeagent.roles.central.runs): a directory where every run writes
    # run-named files, <cluster>/<run id>/v<version>.ckpt, at every global replication point (split-
    # federated, allreduce: every epoch, step); "auto": "checkpoints" in the state directory ($STATE_DIRECTORY
    # under systemd, else ~/.local/state/edgeagent), what `edgeagent central` takes unless told; None
    # (YAML: off or false): none. A central node started again with the same settings resumes the newest
    # checkpoint of the cluster's latest run by itself (fresh: a new run instead).
    checkpoint: str | None = None
    keep_checkpoints: int = Field(3, ge=1, description="checkpoints of a run kept (the newest)")
    fresh: bool = False  # start a new run even if the latest one of this cluster could be resumed
    resume: str | None = None  # continue the run of this checkpoint file (after the central node failed)
    # Fault injection (tests): SIGKILL this process right after it wrote its N-th checkpoint (1-based).
    die_after_checkpoint: int | None = Field(None, ge=1)
    # AccEPT compression of activations and gradients (papers/004 Sec. 3.3-3.4): none; 2, 3 or 4 bits
    # forward with 8-bit gradients; adaptive (the paper's schedule); auto (bits from measured links).
    # --mode allreduce: none, 8 or 4 (stochastic k-bit gradients of the reduce direction only).
    compression: Literal["none", "2", "3", "4", "8", "adaptive", "auto"] = "none"
    # Emulation changes during the run, "DEVICE@BATCH=SLOWDOWN", e.g. "worker-2@300=5".
    slowdown_changes: list[str] = Field(default_factory=list)
    train: TrainConfig = Field(default_factory=TrainConfig)

    # Whether train.learning_rate is the model's pipelined rate, taken because none was set (rate_for).
    _model_rate: bool = PrivateAttr(False)

    @field_validator("checkpoint", mode="before")
    @classmethod
    def _checkpoint_switch(cls, value: Any) -> Any:
        """``true``/``false`` (YAML's ``on``/``off`` too) and the words ``off``/``none``: ``auto`` or none."""
        if isinstance(value, bool):
            return "auto" if value else None
        if isinstance(value, str) and value.strip().lower() in ("", "off", "none", "false", "no"):
            return None
        return value

    @model_validator(mode="after")
    def _one_period(self) -> CentralConfig:
        """The chain replication period is in batches or in seconds, not both."""
        if self.chain_seconds is not None and "chain_every" in self.model_fields_set:
            raise ValueError(
                f"chain_every ({self.chain_every} batches) and chain_seconds ({self.chain_seconds} s) are "
                "both set: the period T is one of the two"
            )
        return self

    @model_validator(mode="after")
    def _mode_keys(self) -> CentralConfig:
        """A key only other modes read (:func:`~edgeagent.mode_names.mode_keys`), set to anything but its
        default, is refused: silently ignoring it would hide a mistake (a default changes nothing)."""
        for key, modes in mode_keys().items():
            if self.mode in modes or key not in self.model_fields_set:
                continue
            default = type(self).model_fields[key].get_default(call_default_factory=True)
            if getattr(self, key) != default:
                raise ValueError(f"{key} applies to {applies_to(modes)} (mode is {self.mode})")
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _pipelined_learning_rate(cls, data: Any, handler: Any) -> Any:
        """Under ``train.pipelined_rate``, a learning rate not set (YAML, flag or
        ``TrainConfig(learning_rate=...)``) is the model's rate under staleness, where it has one
        (:data:`PIPELINED_LEARNING_RATES`); :meth:`rate_for` scales it to the run's depth once the devices
        are known."""
        given = cls._model_learning_rate(data)
        config = handler(given)
        if given is not data:
            config._model_rate = True
        return config

    @property
    def model_rate(self) -> bool:
        """Whether ``train.learning_rate`` is the model's pipelined rate, taken because none was set."""
        return self._model_rate

    def rate_for(self, devices: int) -> float:
        """The learning rate of a run on ``devices`` devices (the central node included): the one set, or
        the model's pipelined rate scaled to the pipeline mode's staleness (:func:`staleness_scaled`)."""
        rate = self.train.learning_rate
        if not self._model_rate or self.mode != "pipeline":
            return rate
        return staleness_scaled(rate, self.train.in_flight or devices)

    def for_devices(self, devices: int) -> CentralConfig:
        """This configuration for a run on ``devices`` devices: the learning rate :meth:`rate_for` gives,
        which then counts as set (a second call keeps it as it is)."""
        rate = self.rate_for(devices)
        if rate == self.train.learning_rate:
            return self
        scaled = self.model_copy(update={"train": self.train.model_copy(update={"learning_rate": rate})})
        scaled._model_rate = False
        return scaled

    @classmethod
    def _model_learning_rate(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        train = data.get("train", {})
        if isinstance(train, TrainConfig):
            if "learning_rate" in train.model_fields_set or not train.pipelined_rate:
                return data
            model, in_flight = train.model, train.in_flight
        elif isinstance(train, dict):
            if "learning_rate" in train or train.get("pipelined_rate") is not True:
                return data
            fields = TrainConfig.model_fields
            model = train.get("model", fields["model"].default)
            in_flight = train.get("in_flight", fields["in_flight"].default)
        else:
            return data  # not a training section: validation says why
        mode = data.get("mode", cls.model_fields["mode"].default)
        rate = pipelined_learning_rate(str(model), str(mode), in_flight)
        if rate is None:
            return data
        if isinstance(train, TrainConfig):
            train = train.model_copy(update={"learning_rate": rate})
        else:
            train = {**train, "learning_rate": rate}
        return {**data, "train": train}


def model_path(name: str) -> str | None:
    """A user model's dotted path as ``module:attribute`` (``pkg.mod.func`` and ``pkg.mod:func`` name the
    same function), or None when ``name`` is not a dotted path (a built-in model's name, or garbage)."""
    module, colon, attribute = name.partition(":")
    if not colon:
        module, _, attribute = name.rpartition(".")
    return f"{module}:{attribute}" if module and attribute else None


class WorkerConfig(BrokerAccess):
    cluster: str = "default"
    device_id: str = "worker"
    # User models (``pkg.mod:func``) this worker may build when the central node names one: a dotted
    # model is imported and called, so without this list whoever can publish as the central node would
    # run any importable code here. Built-in models need no entry; the central node needs none (it
    # imports the model it was told to train).
    allowed_models: list[str] = Field(default_factory=list)
    threads: int = Field(1, ge=1)
    slowdown: float = Field(1.0, ge=1.0)
    heartbeat_interval: float = Field(1.0, gt=0)
    metrics_interval: float = Field(1.0, ge=0, description="seconds between metrics messages; 0: none")
    # Memory this device may use for its stage (weights, stashed versions, activations); 0 = no limit.
    memory_limit_mb: float = Field(0.0, ge=0)
    # Emulated uplink in Mbit/s (everything this device sends); 0 = the real link only.
    link_mbps: float = Field(0.0, ge=0)
    # Seconds measuring h (papers/004 Sec. 3.2) may take when a model is named; what is not reached is
    # missing from the announcement.
    characterise_budget: float = Field(60.0, gt=0, allow_inf_nan=False)
    # Windows per measured sub-model of h and the tiles, interleaved; each time the fastest. Within the
    # budget: on a slow device the later rounds are cut short and the first round's windows stand.
    characterise_rounds: int = Field(CHARACTERISE_ROUNDS, ge=1, le=16)
    # Fault injection (tests, `edgeagent demo --kill`): SIGKILL this process when this batch starts its
    # backward pass here, or when it takes its N-th evaluation batch (1-based, over the process's life).
    die_at_backward: int | None = None
    die_at_eval: int | None = Field(None, ge=1)
    # Fault injection: fill what this device sends with NaN (parse_send_nan: KIND@BATCH, or KIND@BATCH+).
    send_nan: str | None = None
    # Fault injection at run time (bench/chaos.py): each SIGUSR1 fills the next message of this kind
    # (one of NAN_KINDS) that the device sends with NaN.
    nan_on_usr1: Literal["activation", "gradient", "replica", "sync"] | None = None
    # Split-federated training: this device's own training data (a .npz with X and y); it never leaves it.
    dataset: str | None = None
    # Emulated downlink in Mbit/s (what this device receives; split-federated mode); 0 = the real link only.
    down_mbps: float = Field(0.0, ge=0)
    # Leave after one run (the demo); a service keeps serving runs.
    once: bool = False
    # How long the central node of this device's run may stay offline (its last will) before the device
    # leaves the run and announces itself idle: CENTRAL_OFFLINE_BEATS of the central node's heartbeat
    # interval (its Assign says it), at least this (roles.worker.central_watch).
    central_offline_floor: float = Field(30.0, gt=0, allow_inf_nan=False)

    @field_validator("allowed_models")
    @classmethod
    def _dotted_models(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if model_path(name) is None]
        if bad:
            raise ValueError(
                f"{bad[0]!r} is not a dotted path: give pkg.module:function (built-in models need none)"
            )
        return value

    def model_refusal(self, name: object) -> str | None:
        """Why this worker will not build the model ``name`` (an assignment's or a discovery's), or None:
        a dotted path must be on ``allowed_models``."""
        path = model_path(name) if isinstance(name, str) else None
        if path is None or path in {model_path(allowed) for allowed in self.allowed_models}:
            return None
        return (
            f"model {name!r} is not on {self.device_id}'s allow-list: a dotted model is imported and run, "
            f"so a worker builds only the built-in models and those named in its configuration "
            f"(worker.yaml: allowed_models: [{path}], or `edgeagent worker --allow-model {path}`)"
        )

    @model_validator(mode="after")
    def _check_send_nan(self) -> WorkerConfig:
        if self.send_nan is not None:
            parse_send_nan(self.send_nan)
        return self


class DemoConfig(_Frozen):
    workers: int = Field(2, ge=0)
    slowdowns: list[float] = Field(default_factory=list)
    broker: str | None = None
    central: CentralConfig = Field(default_factory=CentralConfig)


M = TypeVar("M", bound=BaseModel)


def _describe(error: ValidationError, source: str) -> str:
    lines = []
    for e in error.errors():
        key = ".".join(str(p) for p in e["loc"])
        if not key and e["type"] == "value_error":  # a rule over several keys: its message names them
            lines.append(f"{source}: {str(e['msg']).removeprefix('Value error, ')}")
        elif e["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key {key!r}")
        else:
            lines.append(f"{source}: {key}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def build(model: type[M], data: dict[str, Any], *, source: str = "<arguments>") -> M:
    """Validate ``data`` into ``model``; raise :class:`ConfigError` that names the source and keys."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping, got {type(data).__name__}")
    return data


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overrides`` (flags that were given) into ``base`` (from YAML).

    A ``train.model`` that changes the model drops the YAML's ``model_options``: they were the other
    model's (``--model mlp`` over the shipped central.yaml's MobileNetV2 was refused for its
    ``width_mult``); options given with it stand alone."""
    train, given = base.get("train"), overrides.get("train")
    if (
        isinstance(train, dict)
        and isinstance(given, dict)
        and given.get("model") not in (None, train.get("model"))
    ):
        base = {**base, "train": {k: v for k, v in train.items() if k != "model_options"}}
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load(model: type[M], path: str | Path | None, overrides: dict[str, Any]) -> M:
    """Read ``path`` (if any), apply ``overrides``, validate."""
    data = load_yaml(path) if path else {}
    return build(model, merge(data, overrides), source=str(path) if path else "<arguments>")
