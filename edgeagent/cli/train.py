"""The training commands: ``edgeagent demo`` (everything on this machine), ``central`` and ``worker``."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import click
import yaml

from edgeagent.cli.options import ACCESS_KEYS, F, access_options
from edgeagent.cli.runfiles import finish_report, preflight
from edgeagent.config import CentralConfig, DemoConfig, WorkerConfig, build, load, load_yaml, merge
from edgeagent.ops import shipped
from edgeagent.ops.logs import setup_logging
from edgeagent.ops.signals import StopRequested, sigterm_stops, sigterm_unwinds

__all__ = ["central", "demo", "worker"]

log = logging.getLogger("edgeagent")


def _floats(text: str | None) -> list[float]:
    if not text:
        return []
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers like 1,1,6; got {text!r}") from None


def _shipped_config(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else str(shipped.config_file(value))


CONFIG_OPTION: dict[str, Any] = {
    "type": click.Path(dir_okay=False),
    "callback": _shipped_config,
    "help": f"YAML file; a name not found here (central.yaml, configs/worker.yaml) is taken from the "
    f"shipped examples in {shipped.CONFIGS}.",
}


def train_options(f: F) -> F:
    """Flags shared by ``demo`` and ``central``; each one overrides the YAML file's value."""
    options = [
        click.option("--config", "config_file", **CONFIG_OPTION),
        click.option("--epochs", type=int, help="Epochs to train."),
        click.option("--model", help="mlp | cnn | mobilenetv2 | pkg.module:function."),
        click.option(
            "--model-option",
            "model_option",
            multiple=True,
            help="KEY=VALUE for the model (YAML value), e.g. width_mult=0.25 or hidden=[256,128].",
        ),
        click.option("--dataset", help="digits | synthetic[:N:CxHxW:K] | FILE.npz"),
        click.option("--batch-size", type=int),
        click.option(
            "--lr",
            "learning_rate",
            type=float,
            help="Learning rate (default 0.05: what one device would use; the pipeline compensates).",
        ),
        click.option("--momentum", type=float, help="SGD momentum (default 0.9)."),
        click.option(
            "--lr-schedule",
            type=click.Choice(["constant", "cosine"]),
            help="constant (default) or cosine: from --lr down to 0 over the run.",
        ),
        click.option("--seed", type=int),
        click.option("--in-flight", type=int, help="Batches in flight (0: one per stage; 1: no pipelining)."),
        click.option(
            "--staleness",
            type=click.Choice(["lookahead", "predict", "nesterov", "2bw", "aggregate", "none"]),
            help="How stages compensate stale gradients (default lookahead: the delay-aware Nesterov step "
            "with the forward's weights predicted for the stage's delay); predict (weight prediction), "
            "nesterov (Ajanthan et al.'s rule), 2bw (PipeDream-2BW), aggregate (FTPipeHD's weight "
            "aggregation), none (vertical sync, plain SGD).",
        ),
        click.option(
            "--schedule",
            type=click.Choice(["async", "sync"]),
            help="async (the asynchronous pipeline, default) or sync (--micro-batches per update and a "
            "flush: exact SGD with a bubble).",
        ),
        click.option(
            "--micro-batches",
            type=click.IntRange(min=0),
            help="--schedule sync: micro-batches a batch is split into (default 0: one per stage).",
        ),
        click.option(
            "--pipelined-rate/--no-pipelined-rate",
            default=None,
            help="The rate patch of earlier versions, to compare: a pipelined mobilenetv2 with no --lr takes "
            "0.02, scaled down beyond 4 stages.",
        ),
        click.option(
            "--aggregation/--no-aggregation",
            default=None,
            hidden=True,
            help="Deprecated: --staleness aggregate / --staleness none.",
        ),
        click.option("--max-batches", type=int, help="Stop after this many batches."),
        click.option(
            "--init-weights",
            type=click.Path(exists=True, dir_okay=False),
            help="Pre-trained weights to continue from (a state_dict saved by --save-model).",
        ),
        click.option("--broker", help="mqtt://[user:pass@]host:port or mqtts://..."),
        click.option("--cluster", help="Cluster name: the topic root edgeagent/v1/<cluster>/."),
        click.option("--report", type=click.Path(dir_okay=False), help="Write a JSON run report here."),
        click.option("--save-model", type=click.Path(dir_okay=False), help="Save the trained model here."),
        click.option(
            "--mode",
            type=click.Choice(["pipeline", "hybrid", "split-federated", "allreduce"]),
            help="Training mode: pipeline (FTPipeHD's asynchronous pipeline, the default); hybrid (a stage "
            "may be held by several devices; the planner decides how many); split-federated (PiPar: the "
            "data stays on the devices, each worker's --dataset); allreduce (data-parallel: a replica per "
            "device, gradients averaged by --collective).",
        ),
        click.option(
            "--collective",
            type=click.Choice(["ft-tree", "ft-tree-thesis", "tree", "ring", "ps-sync", "ps-async", "direct"]),
            help="Allreduce mode: ft-tree (papers/001's fault-tolerant tree, our broadcast rule; default), "
            "ft-tree-thesis (Algorithms 1-2 as written), tree, ring, ps-sync, ps-async (a parameter "
            "server on the central node), direct (all-to-all).",
        ),
        click.option(
            "--allreduce-timeout",
            type=float,
            help="Allreduce mode: a fixed timeout in seconds on every link (the thesis: 0.5 or 1); default: "
            "adaptive, from each link's measured round trips.",
        ),
        click.option(
            "--fail-link",
            "fail_links",
            multiple=True,
            help="Allreduce mode: A,B@FROM:TO drops every message between devices A and B during steps "
            "FROM..TO (A,B@FROM: from then on); repeatable.",
        ),
        click.option(
            "--split",
            type=click.Choice(["iid", "noniid"]),
            help="Allreduce and split-federated modes: each worker's shard of the data set, iid (default) or "
            "by label.",
        ),
        click.option(
            "--splitfed-plan",
            type=click.Choice(["ours", "paper", "common", "fl", "sfl", "fixed", "exhaustive"]),
            help="Split-federated: how each device's (P, N) is chosen (ours: per device; paper: PiPar's "
            "rule; common: the best one for all; fl: the whole model on the devices; sfl: N = 1; fixed: "
            "--split-point and --parallel-batches; exhaustive: every common (P, N) trained for real first, "
            "the paper's baseline).",
        ),
        click.option(
            "--exhaustive-max-n",
            type=click.IntRange(min=1),
            help="--splitfed-plan exhaustive: the largest N tried (default: the batch size).",
        ),
        click.option(
            "--exhaustive-iterations",
            type=click.IntRange(min=1),
            help="--splitfed-plan exhaustive: iterations each (P, N) is trained for (1, as the paper).",
        ),
        click.option(
            "--splitfed-similar",
            type=click.FloatRange(min=0.0),
            help="--splitfed-plan ours: devices whose measured compute and links are within this share "
            "of one another (default 0.3) are planned as one and take one (P, N); 0: each device alone.",
        ),
        click.option(
            "--splitfed-trial/--no-splitfed-trial",
            default=None,
            help="--splitfed-plan ours: the first epoch's iterations try the estimate's N and smaller ones "
            "per device, and the fastest measured is kept (default on); off: the estimate's N, as the paper.",
        ),
        click.option("--split-point", type=int, help="Split-federated: layers [0, P) on every device."),
        click.option("--parallel-batches", type=int, help="Split-federated: mini-batches N per iteration."),
        click.option(
            "--max-replicas",
            type=click.IntRange(min=1),
            help="Hybrid mode: the most devices one stage may have (default: no bound).",
        ),
        click.option(
            "--partition",
            type=click.Choice(["uniform", "dynamic", "oracle"]),
            help="uniform: PipeDream's even split; dynamic: FTPipeHD (default); oracle: DP on true speeds.",
        ),
        click.option(
            "--estimator",
            type=click.Choice(["predictor", "capacity"]),
            help="Device speed for the split: predictor (AccEPT's latency predictor: every device's h from "
            "its announcement, so the first split already uses it; the default) or capacity (FTPipeHD's "
            "eq. 1-3, the baseline).",
        ),
        click.option(
            "--epsilon",
            type=float,
            help="Predictor: a measured stage time this share away from its prediction makes the device "
            "measure its h again (0.1).",
        ),
        click.option(
            "--drift-rule",
            type=click.Choice(["paper", "changed", "rescale"]),
            help="Predictor: a stage time --epsilon off its prediction asks the device for a new h: paper, "
            "always; changed (default), only if the time also moved by --epsilon since the device's last one "
            "on that range, and a time standing 2x or more off its prediction (a device slower than its h "
            "from the start) rescales that device's predicted times to it and re-plans; rescale, changed, "
            "and every standing gap beyond --epsilon is rescaled (it re-plans on contention too).",
        ),
        click.option(
            "--correction",
            type=click.Choice(["linear", "blend", "tiles", "none"]),
            help="Predictor: correct each device's predicted times by the 8 contiguous ranges it measures "
            "with its h (ours): linear (the default), the ranges and h in one linear fit, a speed per "
            "range and an overhead per sub-model; blend, a per-layer correction and the ranges taken as "
            "additive, weighed by how well each predicts h; tiles, the per-layer correction alone; none, "
            "the paper's predictor.",
        ),
        click.option(
            "--tie-break",
            type=click.Choice(["latest", "slack"]),
            help="Pipeline split among those with the best predicted step T*: latest (FTPipeHD's DP, the "
            "latest cuts) or slack (the least sum of stage times within --tie-tolerance of T*: a slow device "
            "keeps fewer layers). Default: slack when the latency predictor plans, latest otherwise.",
        ),
        click.option(
            "--tie-tolerance",
            type=float,
            help="--tie-break slack: the split's step may exceed T* by this share for a smaller sum (0.02).",
        ),
        click.option(
            "--repartition-first", type=int, help="Batches of epoch 0 before the first re-split (10)."
        ),
        click.option("--repartition-every", type=int, help="Batches between later re-splits (100)."),
        click.option(
            "--change-slowdown",
            "slowdown_changes",
            multiple=True,
            help="DEVICE@BATCH=F: from that batch on, DEVICE emulates an F-times slower device.",
        ),
        click.option(
            "--compression",
            type=click.Choice(["none", "2", "3", "4", "8", "adaptive", "auto"]),
            help="AccEPT compression: k-bit activations, 8-bit gradients; adaptive; auto (from the links). "
            "--mode allreduce: 8 or 4 (bits of the gradients it sums; the broadcast stays exact).",
        ),
        click.option(
            "--recovery",
            type=click.Choice(["ftpipehd", "respipe"]),
            help="ftpipehd: re-split over the survivors (default); respipe: the next worker takes over.",
        ),
        click.option("--chain-every", type=int, help="Batches between chain replications (50; 0: off)."),
        click.option("--global-every", type=int, help="Batches between global replications (100; 0: off)."),
        click.option("--replicas", type=int, help="Chain successors holding a replica (ResPipe's z; 1)."),
        click.option(
            "--timeout-multiplier",
            type=float,
            help="Deadlines (batch timer, evaluation, probe) = this x the predicted time of the work (4).",
        ),
        click.option(
            "--batch-timeout", type=float, help="Floor of the batch timer and evaluation deadline (10 s)."
        ),
        click.option("--probe-timeout", type=float, help="Floor of the probe window after a fault (1 s)."),
        click.option(
            "--restart-window",
            type=float,
            help="After a fault, seconds a missing device may take to restart with its id (recovery case 2; "
            "30, a Pi's service restart; 0: recover at once).",
        ),
        click.option(
            "--unmeasured-slowdown",
            type=float,
            help="Until a device has run a batch, take it as this many times slower than the central (50).",
        ),
        click.option(
            "--checkpoint",
            metavar="DIR|auto|off",
            help="Checkpoints at every global replication (split-federated: epoch; allreduce: step), named "
            "<cluster>/<run id>/v<version>.ckpt in DIR; auto: $STATE_DIRECTORY/checkpoints under systemd, "
            "else ~/.local/state/edgeagent/checkpoints (`central`'s default); off: none (`demo`'s default).",
        ),
        click.option(
            "--keep-checkpoints",
            type=click.IntRange(min=1),
            help="Checkpoints of a run kept, the newest (3).",
        ),
        click.option(
            "--home-assistant/--no-home-assistant",
            default=None,
            help="Publish Home Assistant MQTT discovery for every device (off by default).",
        ),
        click.option("--log-level", default="INFO", show_default=True),
    ]
    for option in reversed(options):
        f = option(f)
    return f


_TRAIN_KEYS = (
    "epochs",
    "model",
    "dataset",
    "batch_size",
    "learning_rate",
    "lr_schedule",
    "momentum",
    "seed",
    "in_flight",
    "staleness",
    "schedule",
    "micro_batches",
    "pipelined_rate",
    "aggregation",
    "max_batches",
    "init_weights",
)
_CENTRAL_KEYS = (
    "home_assistant",
    "compression",
    "recovery",
    "chain_every",
    "global_every",
    "replicas",
    "timeout_multiplier",
    "batch_timeout",
    "probe_timeout",
    "restart_window",
    "unmeasured_slowdown",
    "checkpoint",
    "keep_checkpoints",
    "broker",
    "cluster",
    "report",
    "save_model",
    "mode",
    "splitfed_plan",
    "exhaustive_max_n",
    "exhaustive_iterations",
    "splitfed_similar",
    "splitfed_trial",
    "collective",
    "allreduce_timeout",
    "split",
    "split_point",
    "parallel_batches",
    "max_replicas",
    "partition",
    "estimator",
    "epsilon",
    "drift_rule",
    "correction",
    "tie_break",
    "tie_tolerance",
    "repartition_first",
    "repartition_every",
    *ACCESS_KEYS,
)


def _kills(items: tuple[str, ...]) -> dict[str, int | str]:
    """``ID@BATCH`` (SIGKILL at that batch's backward) or ``ID@evalN`` (at its N-th evaluation batch)."""
    kills: dict[str, int | str] = {}
    for item in items:
        device, sep, at = item.partition("@")
        evaluation = at.startswith("eval") and at[4:].isdigit() and int(at[4:]) >= 1
        if not sep or not (at.isdigit() or evaluation):
            raise click.BadParameter(
                f"expected ID@BATCH like worker-1@205 or ID@evalN like worker-2@eval1, got {item!r}",
                param_hint="--kill",
            )
        kills[device] = at if evaluation else int(at)
    return kills


def _model_options(items: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--model-option")
        options[key.strip()] = yaml.safe_load(value)
    return options


def _central_overrides(kw: dict[str, Any]) -> dict[str, Any]:
    train = {k: kw[k] for k in _TRAIN_KEYS if kw.get(k) is not None}
    if kw.get("model_option"):
        train["model_options"] = _model_options(kw["model_option"])
    central = {k: kw[k] for k in _CENTRAL_KEYS if kw.get(k) is not None}
    if kw.get("slowdown_changes"):
        central["slowdown_changes"] = list(kw["slowdown_changes"])
    if kw.get("fail_links"):
        central["fail_links"] = list(kw["fail_links"])
    return {**central, "train": train} if train else central


@click.command()
@train_options
@click.option("--workers", type=int, help="Local worker processes to start (default 2).")
@click.option("--slowdowns", help="Compute slowdown per device, central first, e.g. 1,1,6.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--secure",
    is_flag=True,
    help="Throw-away logins, topic rights and mutual TLS: the embedded broker as deployed on a LAN.",
)
@click.option(
    "--link-mbps",
    "link_mbps",
    help="Emulated uplink in Mbit/s: one value, or one per device (central first), e.g. 0.5 or 4,1,1.",
)
@click.option(
    "--worker-cpu",
    "worker_cpu",
    help="Real CPU limit per worker in percent of one core, e.g. 100,50,25 (0 or empty: none): a cgroup "
    "v1 CFS quota (root; /sys/fs/cgroup/cpu). Unlike --slowdowns it does not scale every layer alike.",
)
@click.option(
    "--worker-threads",
    "worker_threads",
    help="Torch threads per worker, e.g. 1,2 (default 1 each).",
)
@click.option(
    "--kill",
    "kills",
    multiple=True,
    help="ID@BATCH: SIGKILL worker ID when BATCH starts its backward pass; ID@evalN: when it takes its "
    "N-th evaluation batch (fault injection).",
)
def demo(**kw: Any) -> None:
    """Broker + central node + local workers: the whole job on this machine."""
    setup_logging(kw["log_level"], device="central")
    # Without --config the demo runs the shipped demo.yaml (its values are the demo's documented ones).
    source = kw["config_file"] or str(shipped.CONFIGS / "demo.yaml")
    base = load_yaml(source)
    section = build(DemoConfig, base.pop("demo", None) or {}, source=f"{source} (demo:)")
    config = build(CentralConfig, merge(base, _central_overrides({**kw, "broker": None})), source=source)
    preflight(config)
    from edgeagent.cli.demo import parse_worker_cpu, parse_worker_threads, run_demo  # torch: after the checks

    workers = kw["workers"] if kw["workers"] is not None else section.workers
    slowdowns = _floats(kw["slowdowns"]) or list(section.slowdowns)
    cpu, threads = (
        parse_worker_cpu(kw["worker_cpu"], workers),
        parse_worker_threads(kw["worker_threads"], workers),
    )
    with sigterm_unwinds():
        report = run_demo(
            config,
            workers=workers,
            slowdowns=slowdowns,
            broker=kw["broker"],
            show_progress=not kw["no_progress"],
            kills=_kills(kw["kills"]),
            links=_floats(kw["link_mbps"]),
            secure=kw["secure"],
            worker_cpu=cpu,
            worker_threads=threads,
        )
    finish_report(report, config.report)


@click.command()
@train_options
@access_options
@click.option("--workers", type=int, help="Workers to wait for.")
@click.option("--id", "device_id", help="This node's device id (default central).")
@click.option("--slowdown", type=float, help="Emulate a device this many times slower (>= 1).")
@click.option("--threads", type=int, help="Torch threads.")
@click.option(
    "--resume",
    type=click.Path(exists=True, dir_okay=False),
    help="Continue the run of this checkpoint file. Without it a central node resumes the newest "
    "checkpoint of its cluster's latest run by itself, if that run did not end and has its settings.",
)
@click.option(
    "--fresh",
    is_flag=True,
    default=None,
    help="Start a new run even if the latest run of this cluster could be resumed.",
)
@click.option(
    "--die-after-checkpoint",
    type=click.IntRange(min=1),
    hidden=True,
    help="Fault injection: SIGKILL right after writing the N-th checkpoint.",
)
def central(**kw: Any) -> None:
    """The central node: holds the data, runs stage 0 and drives the run."""
    setup_logging(kw["log_level"], device=kw["device_id"] or "central")
    overrides = _central_overrides(kw)
    for key in ("workers", "device_id", "slowdown", "threads", "resume", "fresh", "die_after_checkpoint"):
        if kw.get(key) is not None:
            overrides[key] = kw[key]
    base = load_yaml(kw["config_file"]) if kw["config_file"] else {}
    base.setdefault("checkpoint", "auto")  # the central node checkpoints unless told not to
    config = build(CentralConfig, merge(base, overrides), source=kw["config_file"] or "<arguments>")
    preflight(config)
    # SIGTERM (systemctl stop or restart) suspends the run: a checkpoint, "suspended" on the broker,
    # exit 0; the next start resumes it. Before the run starts it just ends the process.
    with sigterm_stops():
        try:
            from edgeagent.modes import mode
            from edgeagent.roles.central import Central  # torch: after the checks

            report = Central(config, modes=mode).run()
        except StopRequested:
            log.info("stopped by SIGTERM")
            sys.exit(0)
    finish_report(report, config.report)


@click.command()
@click.option("--config", "config_file", **CONFIG_OPTION)
@click.option("--id", "device_id", help="Device id (default: the host name).")
@click.option("--broker", help="mqtt://[user:pass@]host:port or mqtts://...")
@access_options
@click.option("--cluster")
@click.option("--slowdown", type=float, help="Emulate a device this many times slower (>= 1).")
@click.option("--threads", type=int, help="Torch threads.")
@click.option("--heartbeat-interval", type=float)
@click.option("--memory-limit-mb", type=float, help="Memory the stage may use here; the DP respects it.")
@click.option("--link-mbps", type=float, help="Emulated uplink in Mbit/s (what this device sends).")
@click.option(
    "--characterise-budget",
    type=float,
    help="Seconds measuring this device's h for a model may take (default 60).",
)
@click.option(
    "--characterise-rounds",
    type=click.IntRange(1, 16),
    help="Windows per sub-model measured for h, the fastest taken (default 2).",
)
@click.option(
    "--central-offline-floor",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds the run's central node may stay offline before this device leaves the run and "
    "announces itself idle, at least (30; the window is 10 of the central node's heartbeat intervals).",
)
@click.option("--die-at-backward", type=int, hidden=True, help="Fault injection: SIGKILL at this backward.")
@click.option("--die-at-eval", type=int, hidden=True, help="Fault injection: SIGKILL at the N-th eval batch.")
@click.option("--send-nan", hidden=True, help="Fault injection: NaN in what it sends (KIND@BATCH[+]).")
@click.option(
    "--nan-on-usr1",
    type=click.Choice(["activation", "gradient", "replica", "sync"]),
    hidden=True,
    help="Fault injection: each SIGUSR1 fills the next message of this kind it sends with NaN.",
)
@click.option("--dataset", help="Split-federated: this device's own training data (FILE.npz, X and y).")
@click.option("--down-mbps", type=float, help="Split-federated: emulated downlink in Mbit/s (received).")
@click.option(
    "--allow-model",
    "allowed_models",
    multiple=True,
    metavar="PKG.MOD:FUNC",
    help="A user model this worker may build (repeatable; added to allowed_models). Built-in models "
    "need none; any other dotted model is refused.",
)
@click.option("--once", is_flag=True, default=None, help="Exit after one run.")
@click.option("--log-level", default=None)
def worker(**kw: Any) -> None:
    """A worker: runs whichever stage the central node assigns it."""
    allowed = list(kw.pop("allowed_models"))
    overrides = {k: v for k, v in kw.items() if v is not None and k not in ("config_file", "log_level")}
    if "device_id" not in overrides:
        # The id is the login's user name: --id, else worker.yaml's device_id (the unit passes only
        # --config), else the host name. The host name used to win over the file.
        base = load_yaml(kw["config_file"]) if kw["config_file"] else {}
        overrides["device_id"] = base.get("device_id") or os.uname().nodename.split(".")[0]
    level = kw["log_level"] or os.environ.get("EDGEAGENT_LOG_LEVEL", "INFO")
    setup_logging(level, device=overrides["device_id"])
    config = load(WorkerConfig, kw["config_file"], overrides)
    if allowed:  # the flags add to the YAML file's list
        more = build(WorkerConfig, {"allowed_models": allowed}, source="--allow-model").allowed_models
        config = config.model_copy(update={"allowed_models": [*config.allowed_models, *more]})
    from edgeagent.modes import mode
    from edgeagent.roles.worker import Worker  # torch: after the configuration is checked

    w = Worker(config, modes=mode)
    signal.signal(signal.SIGTERM, lambda *_: w.stop())
    if config.nan_on_usr1 is not None:
        signal.signal(signal.SIGUSR1, lambda *_: w.arm_nan())
    try:
        sys.exit(w.serve())
    except KeyboardInterrupt:
        w.stop()
