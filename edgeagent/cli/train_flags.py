"""``central``'s and ``demo``'s options in their groups (see :mod:`edgeagent.cli.flags` for the rules)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import get_args

import click

from edgeagent.cli.flags import CONFIG, Flag, Group, choice, envvar
from edgeagent.config import CollectiveName, TrainConfig
from edgeagent.mode_names import MODES, applies_to, mode_keys, mode_names, modes_help

T = TrainConfig


class ModeChoice(click.Choice):
    """``--mode``'s choices: the registry's modes (:data:`edgeagent.mode_names.MODES`) as they are when a
    command line is parsed, so that a mode registered at run time (a test's) is one too."""

    def __init__(self) -> None:
        super().__init__(mode_names())

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(MODES)

    @choices.setter
    def choices(self, _: object) -> None:
        """click's constructor sets its list: the registry is the list."""


CONFIG_FLAGS = (
    Flag(
        ("--print-config",),
        "print_config",
        "Print the effective configuration (YAML) and exit.",
        None,
        kwargs={"is_flag": True, "default": False},
    ),
)

RUN = (
    Flag(
        ("--mode",),
        "mode",
        modes_help(),
        kwargs={"type": ModeChoice()},
    ),
    Flag(("--model",), "model", "mlp | cnn | mobilenetv2 | pkg.module:function.", T),
    Flag(
        ("--model-option",),
        "model_option",
        "KEY=VALUE for the model (a YAML value), e.g. width_mult=0.25 or hidden=[256,128]; repeatable.",
        None,
        kwargs={"multiple": True},
    ),
    Flag(("--dataset",), "dataset", "digits | synthetic[:N:CxHxW:K] | FILE.npz.", T),
    Flag(("--epochs",), "epochs", "Epochs to train.", T, kwargs={"type": int}),
    Flag(("--batch-size",), "batch_size", "Samples per batch.", T, kwargs={"type": int}),
    Flag(
        ("--learning-rate",),
        "learning_rate",
        "What one device would use: the pipeline compensates its staleness.",
        T,
        aliases=("--lr",),
        kwargs={"type": float},
    ),
    Flag(("--momentum",), "momentum", "SGD momentum.", T, kwargs={"type": float}),
    Flag(
        ("--lr-schedule",),
        "lr_schedule",
        "constant; cosine: from --learning-rate down to 0; step: times --lr-gamma at each "
        "--lr-milestones epoch.",
        T,
        kwargs={"type": choice("constant", "cosine", "step")},
    ),
    Flag(
        ("--lr-milestones",),
        "lr_milestones",
        "--lr-schedule step: epochs where the rate drops, e.g. 30,60 (--compression adaptive steps "
        "its bits there).",
        T,
    ),
    Flag(
        ("--lr-gamma",),
        "lr_gamma",
        "--lr-schedule step: the factor at each milestone.",
        T,
        kwargs={"type": float},
    ),
    Flag(("--seed",), "seed", "Seed of the model's weights and the data's order.", T, kwargs={"type": int}),
    Flag(("--max-batches",), "max_batches", "Stop after this many batches in all.", T, kwargs={"type": int}),
    Flag(
        ("--init-weights",),
        "init_weights",
        "Weights to continue from (a file --save-model wrote).",
        T,
        kwargs={"type": click.Path(exists=True, dir_okay=False)},
    ),
    Flag(
        ("--compression",),
        "compression",
        "k-bit activations with 8-bit gradients (AccEPT); adaptive; "
        "auto (bits from the measured links). --mode allreduce: 8 or 4 (the gradients it sums).",
        kwargs={"type": choice("none", "2", "3", "4", "8", "adaptive", "auto")},
    ),
    Flag(
        ("--report",),
        "report",
        "Write a JSON run report (and its plots) here.",
        kwargs={"type": click.Path(dir_okay=False)},
    ),
    Flag(
        ("--save-model",),
        "save_model",
        "Save the trained model here.",
        kwargs={"type": click.Path(dir_okay=False)},
    ),
)

LOG_LEVEL = Flag(
    ("--log-level",),
    "log_level",
    "DEBUG, INFO, WARNING or ERROR.",
    None,
    default="INFO",
    kwargs={"envvar": envvar("log_level")},
)

CLUSTER = (
    Flag(("--broker",), "broker", "mqtt://[user:pass@]host:port or mqtts://..."),
    Flag(("--cluster",), "cluster", "Cluster name: the topic root edgeagent/v1/<cluster>/."),
    Flag(
        ("--home-assistant/--no-home-assistant",),
        "home_assistant",
        "Publish Home Assistant MQTT discovery for every device.",
    ),
    Flag(
        ("--prometheus-port",),
        "prometheus_port",
        "Serve every device's metrics for Prometheus on this port (/metrics).",
        kwargs={"type": click.IntRange(1, 65535)},
    ),
)

SECURITY = (
    Flag(("--username",), "username", "Broker login.", default="the device id"),
    Flag(
        ("--password-file",),
        "password_file",
        "File holding the broker password (relative names are "
        "also looked up in $CREDENTIALS_DIRECTORY, systemd's LoadCredential=).",
    ),
    Flag(("--ca-file",), "ca_file", "CA of the broker's certificate (mqtts://)."),
    Flag(("--cert-file",), "cert_file", "This device's client certificate (mutual TLS)."),
    Flag(("--key-file",), "key_file", "Key of --cert-file."),
    Flag(
        ("--insecure-plaintext",),
        "insecure_plaintext",
        "Send the password over plain mqtt:// to a broker "
        "beyond loopback anyway (use mqtts:// with --ca-file instead).",
        kwargs={"is_flag": True},
    ),
)

RECOVERY = (
    Flag(
        ("--checkpoint",),
        "checkpoint",
        "DIR for <cluster>/<run id>/v<version>.ckpt at every global "
        "replication (split-federated: epoch; allreduce: step); auto: $STATE_DIRECTORY/checkpoints under "
        "systemd, else ~/.local/state/edgeagent/checkpoints; off: none.",
        kwargs={"metavar": "DIR|auto|off"},
    ),
    Flag(
        ("--keep-checkpoints",),
        "keep_checkpoints",
        "Checkpoints of a run kept, the newest.",
        kwargs={"type": click.IntRange(min=1)},
    ),
    Flag(
        ("--chain-every",),
        "chain_every",
        "Batches between chain replications (0: off).",
        kwargs={"type": int},
    ),
    Flag(
        ("--chain-seconds",),
        "chain_seconds",
        "Seconds between chain replications (ResPipe's T, 30 in its testbed), instead of --chain-every: "
        "turned into batches from the planned step, then the measured rate at every re-split and recovery.",
        kwargs={"type": click.FloatRange(min=0, min_open=True), "metavar": "T"},
    ),
    Flag(
        ("--global-every",),
        "global_every",
        "Batches between global replications (0: off).",
        kwargs={"type": int},
    ),
    Flag(("--replicas",), "replicas", "Chain successors holding a replica.", kwargs={"type": int}),
    Flag(
        ("--replica-share",),
        "replica_share",
        "Share of a slow uplink (--link-mbps) replicas may take, in its idle time (0: at once, as FTPipeHD).",
        kwargs={"type": click.FloatRange(0, 1)},
    ),
    Flag(
        ("--replica-pace-mbps",),
        "replica_pace_mbps",
        "Pace the replicas of a worker whose measured real uplink is below this (Mbit/s; 0: off).",
        kwargs={"type": click.FloatRange(0)},
    ),
    Flag(
        ("--timeout-multiplier",),
        "timeout_multiplier",
        "Deadlines (batch timer, evaluation, probe) = this x the predicted time of the work.",
        kwargs={"type": float},
    ),
    Flag(
        ("--batch-timeout",),
        "batch_timeout",
        "Floor (s) of the batch timer and the evaluation deadline.",
        kwargs={"type": float},
    ),
    Flag(
        ("--probe-timeout",),
        "probe_timeout",
        "Floor (s) of the probe window after a fault.",
        kwargs={"type": float},
    ),
    Flag(
        ("--restart-window",),
        "restart_window",
        "Seconds a missing device may take to come back with its "
        "id after a fault (a Pi's service restart; 0: recover at once).",
        kwargs={"type": float},
    ),
)

PIPELINE = (
    Flag(
        ("--in-flight",),
        "in_flight",
        "Batches in flight (0: one per stage; 1: no pipelining).",
        T,
        kwargs={"type": int},
    ),
    Flag(
        ("--staleness",),
        "staleness",
        "How stages compensate stale gradients: lookahead (a delay-aware "
        "Nesterov step with the forward's weights predicted for the delay), predict (weight prediction), "
        "nesterov (Ajanthan et al.), 2bw (PipeDream-2BW), aggregate (FTPipeHD's weight aggregation), none "
        "(vertical sync, plain SGD).",
        T,
        kwargs={"type": choice("lookahead", "predict", "nesterov", "2bw", "aggregate", "none")},
    ),
    Flag(
        ("--schedule",),
        "schedule",
        "async (the asynchronous pipeline) or sync (--micro-batches per update "
        "and a flush: exact SGD with a bubble).",
        T,
        kwargs={"type": choice("async", "sync")},
    ),
    Flag(
        ("--micro-batches",),
        "micro_batches",
        "--schedule sync: micro-batches per batch (0: one per stage).",
        T,
        kwargs={"type": click.IntRange(min=0)},
    ),
)

HYBRID = (
    Flag(
        ("--max-replicas",),
        "max_replicas",
        "The most devices one stage may have.",
        default="no bound",
        kwargs={"type": click.IntRange(min=1)},
    ),
    Flag(
        ("--replicate-first/--no-replicate-first",),
        "replicate_first",
        "Stage 0 may be the central node plus helpers it sends every batch's input rows to, where the "
        "planner predicts it faster.",
    ),
)

SPLITFED = (
    Flag(
        ("--splitfed-plan",),
        "splitfed_plan",
        "How each device's split point P and mini-batches N are "
        "chosen: ours (per device); paper (PiPar's rule); common (the best one for all); fl (the whole "
        "model on the devices); sfl (N = 1); fixed (--split-point, --parallel-batches); exhaustive "
        "(PiPar's baseline: every common (P, N) trained for real first).",
        kwargs={"type": choice("ours", "paper", "common", "fl", "sfl", "fixed", "exhaustive")},
    ),
    Flag(
        ("--split-point",),
        "split_point",
        "Layers [0, P) on every device.",
        default="planned",
        kwargs={"type": int},
    ),
    Flag(
        ("--parallel-batches",),
        "parallel_batches",
        "Mini-batches N per iteration.",
        default="planned",
        kwargs={"type": int},
    ),
    Flag(
        ("--splitfed-similar",),
        "splitfed_similar",
        "--splitfed-plan ours: devices whose measured compute "
        "and links are within this share of one another take one (P, N); 0: each alone.",
        kwargs={"type": click.FloatRange(min=0.0)},
    ),
    Flag(
        ("--splitfed-trial/--no-splitfed-trial",),
        "splitfed_trial",
        "--splitfed-plan ours: the first "
        "epoch tries the estimate's N and smaller ones per device and keeps the fastest measured.",
    ),
    Flag(
        ("--splitfed-server-threads",),
        "splitfed_server_threads",
        "Threads the server-side models run on at once, each device's mini-batches in arrival order; "
        "1: one after another; 0: the cores over torch's threads.",
        kwargs={"type": click.IntRange(min=0)},
    ),
    Flag(
        ("--exhaustive-max-n",),
        "exhaustive_max_n",
        "--splitfed-plan exhaustive: the largest N tried.",
        default="the batch size",
        kwargs={"type": click.IntRange(min=1)},
    ),
    Flag(
        ("--exhaustive-iterations",),
        "exhaustive_iterations",
        "--splitfed-plan exhaustive: iterations each (P, N) is trained for.",
        kwargs={"type": click.IntRange(min=1)},
    ),
)

SPLIT = Flag(
    ("--split",),
    "split",
    "Each worker's shard of the data set: iid, or noniid (by label).",
    kwargs={"type": choice("iid", "noniid")},
)

ALLREDUCE = (
    Flag(
        ("--collective",),
        "collective",
        "ft-tree (the fault-tolerant tree allreduce, our broadcast rule), "
        "ft-tree-thesis (its Algorithms 1-2 as written), tree, ring, ps-sync, ps-async (a parameter server "
        "on the central node), direct (all-to-all).",
        kwargs={"type": choice(*get_args(CollectiveName))},
    ),
    Flag(
        ("--allreduce-timeout",),
        "allreduce_timeout",
        "A fixed timeout (s) on every link.",
        default="adaptive, from each link's round trips",
        kwargs={"type": float},
    ),
    Flag(
        ("--allreduce-timeout-floor",),
        "allreduce_timeout_floor",
        "Adaptive timeouts: the least (s).",
        kwargs={"type": float},
    ),
    Flag(
        ("--fail-link",),
        "fail_links",
        "A,B@FROM:TO: drop every message between devices A and B during "
        "steps FROM..TO (A,B@FROM: from then on); repeatable (fault injection).",
        kwargs={"multiple": True},
    ),
)

LAB = (
    Flag(
        ("--partition",),
        "partition",
        "uniform (PipeDream's even split), dynamic (FTPipeHD: re-split from "
        "measurements) or oracle (the split fed the true slowdowns).",
        kwargs={"type": choice("uniform", "dynamic", "oracle")},
    ),
    Flag(
        ("--estimator",),
        "estimator",
        "A device's speed for the split: predictor (AccEPT's latency "
        "predictor) or capacity (FTPipeHD's capacity estimate, the baseline).",
        kwargs={"type": choice("predictor", "capacity")},
    ),
    Flag(
        ("--epsilon",),
        "epsilon",
        "Predictor: a stage time this share off its prediction makes the device measure again.",
        kwargs={"type": float},
    ),
    Flag(
        ("--drift-rule",),
        "drift_rule",
        "Predictor: a stage time --epsilon off asks for a new "
        "measurement: paper (AccEPT's rule: always); changed (only if it also moved by --epsilon since the "
        "device's last one; a gap of 2x or more rescales and re-plans); rescale (changed, and every "
        "standing gap is rescaled).",
        kwargs={"type": choice("paper", "changed", "rescale")},
    ),
    Flag(
        ("--correction",),
        "correction",
        "Predictor: correct predicted times by the ranges each device "
        "measures: linear (one linear fit), blend, tiles, or none (AccEPT's predictor as published).",
        kwargs={"type": choice("linear", "blend", "tiles", "none")},
    ),
    Flag(
        ("--tie-break",),
        "tie_break",
        "Among splits with the best step T*: latest (FTPipeHD's DP) or "
        "slack (the least sum of stage times within --tie-tolerance of T*).",
        default="slack with the predictor, else latest",
        kwargs={"type": choice("latest", "slack")},
    ),
    Flag(
        ("--tie-tolerance",),
        "tie_tolerance",
        "--tie-break slack: share of T* a split may exceed it by.",
        kwargs={"type": float},
    ),
    Flag(
        ("--repartition-first",),
        "repartition_first",
        "Batches of epoch 0 before the first re-split.",
        kwargs={"type": int},
    ),
    Flag(
        ("--repartition-every",),
        "repartition_every",
        "Batches between later re-splits.",
        kwargs={"type": int},
    ),
    Flag(
        ("--recovery",),
        "recovery",
        "ftpipehd (re-split over the survivors) or respipe (ResPipe: the next worker takes over).",
        kwargs={"type": choice("ftpipehd", "respipe")},
    ),
    Flag(
        ("--recovery-mode",),
        "recovery_mode",
        "resume (a dead worker's layers from its replica, only its lost batches replayed) or rollback "
        "(every stage back to the replica's version, every batch since replayed).",
        kwargs={"type": choice("resume", "rollback")},
    ),
    Flag(
        ("--pipelined-rate/--no-pipelined-rate",),
        "pipelined_rate",
        "The rate patch of earlier versions: "
        "a pipelined mobilenetv2 with no --learning-rate takes 0.02, scaled down beyond 4 stages.",
        T,
    ),
    Flag(
        ("--aggregation/--no-aggregation",),
        "aggregation",
        "Deprecated: --staleness aggregate / none.",
        None,
        kwargs={"hidden": True},
    ),
    Flag(
        ("--unmeasured-slowdown",),
        "unmeasured_slowdown",
        "Until a device has run a batch, take it as this many times slower than the central node.",
        kwargs={"type": float},
    ),
    Flag(
        ("--change-slowdown",),
        "slowdown_changes",
        "DEVICE@BATCH=F: from that batch on, DEVICE emulates an F-times slower device; repeatable.",
        kwargs={"multiple": True},
    ),
)


def mode_title(title: str, keys: Iterable[str]) -> str:
    modes = {mode_keys()[k] for k in keys}
    assert len(modes) == 1, modes
    return f"{title} ({applies_to(modes.pop())})"


def train_groups(command: str) -> list[Group]:
    """``demo``'s and ``central``'s groups (the command's own options go in by :func:`with_extra`)."""
    checkpoint = "off" if command == "demo" else "auto"
    recovery = tuple(
        Flag(f.decls, f.key, f.help, f.model, checkpoint, f.aliases, f.kwargs) if f.key == "checkpoint" else f
        for f in RECOVERY
    )
    return [
        Group("Run", (CONFIG, *CONFIG_FLAGS, *RUN, LOG_LEVEL)),
        Group("Cluster and broker", CLUSTER),
        Group("Security", SECURITY),
        Group("Checkpoints, replication and deadlines", recovery),
        Group("Pipeline (--mode pipeline and hybrid)", PIPELINE),
        Group(mode_title("Hybrid", ["max_replicas", "replicate_first"]), HYBRID),
        Group(mode_title("Split-federated", [f.key for f in SPLITFED]), (*SPLITFED, SPLIT)),
        Group(mode_title("Allreduce", [f.key for f in ALLREDUCE]), ALLREDUCE),
        Group("Advanced / lab: research baselines, emulation and fault injection", LAB),
    ]


def with_extra(groups: list[Group], extra: dict[str, tuple[Flag, ...]]) -> list[Group]:
    """``groups`` with a command's own flags added at the end of the groups titled by ``extra``'s keys."""
    out = []
    for group in groups:
        prefix = next((t for t in extra if group.title.startswith(t)), None)
        out.append(Group(group.title, (*group.flags, *extra[prefix]), group.help) if prefix else group)
    return out
