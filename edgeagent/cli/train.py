"""The training commands: ``edgeagent demo`` (everything on this machine), ``central`` and ``worker``."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from edgeagent.cli.options import ACCESS_KEYS, F, access_options
from edgeagent.config import CentralConfig, DemoConfig, WorkerConfig, build, load, load_yaml, merge
from edgeagent.errors import ConfigError
from edgeagent.ops.logs import console, setup_logging
from edgeagent.ops.signals import sigterm_unwinds

__all__ = ["central", "demo", "worker"]

log = logging.getLogger("edgeagent")


def _floats(text: str | None) -> list[float]:
    if not text:
        return []
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers like 1,1,6; got {text!r}") from None


def train_options(f: F) -> F:
    """Flags shared by ``demo`` and ``central``; each one overrides the YAML file's value."""
    options = [
        click.option(
            "--config", "config_file", type=click.Path(dir_okay=False), help="YAML file (see configs/)."
        ),
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
            type=click.Path(dir_okay=False),
            help="Write a checkpoint here at every global replication (split-federated, allreduce: epoch).",
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


def _check_writable(flag: str, path: str) -> None:
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; give a file name")
    if not folder.is_dir():
        raise ConfigError(
            f"{flag} {path}: the directory {folder} does not exist; create it or pick another path"
        )
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ConfigError(f"{flag} {path}: not writable by this user; pick another path")


def _check_loadable(flag: str, path: str, what: str) -> None:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # whatever torch says, the file cannot be used: name it and the flag
        if isinstance(exc, pickle.UnpicklingError):  # torch's text here is a page about weights_only
            reason = "not written by torch.save, or it holds more than tensors and plain data"
        else:
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            reason = lines[0][:120]
        raise ConfigError(f"{flag} {path}: cannot read it ({reason}); give {what}") from exc
    if not isinstance(state, dict):
        raise ConfigError(f"{flag} {path} holds a {type(state).__name__}, not {what}")


def _preflight(config: CentralConfig) -> None:
    """The files a run reads and writes, checked before it starts: a typo in --report must not cost the
    whole run. (Loading --init-weights and --resume twice costs a second at start-up; the central node
    loads them again because it is also started without the CLI.)"""
    for flag, path in (
        ("--report", config.report),
        ("--save-model", config.save_model),
        ("--checkpoint", config.checkpoint),
    ):
        if path:
            _check_writable(flag, path)
    if config.train.init_weights:
        _check_loadable("--init-weights", config.train.init_weights, "a state dict saved with --save-model")
    if config.resume:
        _check_loadable("--resume", config.resume, "a checkpoint written with --checkpoint")


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
    source = kw["config_file"] or "<arguments>"
    base = load_yaml(kw["config_file"]) if kw["config_file"] else {}
    section = build(DemoConfig, base.pop("demo", None) or {}, source=f"{source} (demo:)")
    config = build(CentralConfig, merge(base, _central_overrides({**kw, "broker": None})), source=source)
    _preflight(config)
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
    _finish_report(report, config.report)


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
    help="Continue the run of this checkpoint (written with --checkpoint) after a central failure.",
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
    for key in ("workers", "device_id", "slowdown", "threads", "resume", "die_after_checkpoint"):
        if kw.get(key) is not None:
            overrides[key] = kw[key]
    config = load(CentralConfig, kw["config_file"], overrides)
    _preflight(config)
    from edgeagent.roles.central import Central  # torch: after the checks

    report = Central(config).run()
    _finish_report(report, config.report)


@click.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML file (see configs/).")
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
@click.option("--die-at-backward", type=int, hidden=True, help="Fault injection: SIGKILL at this backward.")
@click.option("--die-at-eval", type=int, hidden=True, help="Fault injection: SIGKILL at the N-th eval batch.")
@click.option("--send-nan", hidden=True, help="Fault injection: NaN in what it sends (KIND@BATCH[+]).")
@click.option("--dataset", help="Split-federated: this device's own training data (FILE.npz, X and y).")
@click.option("--down-mbps", type=float, help="Split-federated: emulated downlink in Mbit/s (received).")
@click.option("--once", is_flag=True, default=None, help="Exit after one run.")
@click.option("--log-level", default=None)
def worker(**kw: Any) -> None:
    """A worker: runs whichever stage the central node assigns it."""
    overrides = {k: v for k, v in kw.items() if v is not None and k not in ("config_file", "log_level")}
    if "device_id" not in overrides:
        overrides["device_id"] = os.uname().nodename.split(".")[0]
    level = kw["log_level"] or os.environ.get("EDGEAGENT_LOG_LEVEL", "INFO")
    setup_logging(level, device=overrides["device_id"])
    config = load(WorkerConfig, kw["config_file"], overrides)
    from edgeagent.roles.worker import Worker  # torch: after the configuration is checked

    w = Worker(config)
    signal.signal(signal.SIGTERM, lambda *_: w.stop())
    try:
        sys.exit(w.serve())
    except KeyboardInterrupt:
        w.stop()


def _finish_report(report: Any, path: str | None) -> None:
    data = report.to_dict()
    acc = ", ".join(f"{100 * a:.1f}" for a in data["test_accuracy_per_epoch"])
    console.print(
        f"[bold green]done[/]: final test accuracy {100 * data['final_accuracy']:.2f}% "
        f"after {data['batches']} batches / {data['epochs']} epochs; "
        f"{data['samples_per_second']:.1f} samples/s; wall {data['wall_seconds']:.1f} s\n"
        f"  accuracy per epoch (%): {acc}\n  partition points: {data['partitions'][-1]['points']}"
    )
    if data.get("estimator") == "predictor":
        taken = data.get("characterisations", [])
        measured = ", ".join(f"{c['device']} {c['seconds']:.1f} s (batch {c['batch']})" for c in taken)
        adapted = len(data.get("adaptations", []))
        console.print(f"  latency predictor: h measured by {measured or 'nobody'}; adapted {adapted} times")
    groups = data["partitions"][-1].get("groups") if data["partitions"] else None
    if groups and any(len(g) > 1 for g in groups):
        held = "; ".join(f"stage {k}: {' + '.join(g)}" for k, g in enumerate(groups))
        console.print(f"  stages held by (hybrid): {held}")
    for f in data.get("failovers", []):
        resumed = f.get("resumed")
        after = f"; training went on {resumed - f['detected']:.2f} s after detection" if resumed else ""
        console.print(
            f"  failover at batch {f['batch']}: {', '.join(f['devices'])} gone, stage(s) {f['stages']} "
            f"went on with {[f['groups'][k] for k in f['stages']]} (no rollback{after})"
        )
    for rec in data["recoveries"]:
        if rec.get("case") == "central":
            console.print(f"  resumed from the checkpoint of batch {rec['resumed_from']}")
            continue
        console.print(
            f"  recovery (case {rec['case']}) at batch {rec['batch']}: lost {rec['lost'] or 'none'}, "
            f"restarted {rec['restarted'] or 'none'}; {rec['resumed_at'] - rec['detected_at']:.2f} s after "
            f"detection; rolled back to batch {rec['rolled_back_to']} ({rec['batches_replayed']} replayed)"
        )
    if path:
        Path(path).write_text(json.dumps(data, indent=2))
        console.print(f"report written to {path}")
        try:
            from edgeagent.ops.report import write_plots

            plots = write_plots(data, path)
        except Exception as exc:  # a plotting problem must never cost the user the JSON report
            log.warning("report plots not written: %s", exc)
        else:
            console.print("plots: " + ", ".join(str(p) for p in plots))
