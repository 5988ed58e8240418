"""The training commands: ``edgeagent demo`` (everything on this machine), ``central`` and ``worker``."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import click
import cloup
import yaml

from edgeagent.cli.flags import CONFIG, ENV_EPILOG, SETTINGS, Flag, apply, envvar
from edgeagent.cli.options import ACCESS_KEYS
from edgeagent.cli.runfiles import finish_report, preflight
from edgeagent.cli.train_flags import train_groups, with_extra
from edgeagent.cli.worker_flags import worker_groups as _worker_groups
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


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated epochs like 30,60; got {text!r}", param_hint=flag
        ) from None


CONFIG_OPTION: dict[str, Any] = CONFIG.kwargs | {"help": CONFIG.help}


def _demo_defaults() -> DemoConfig:
    """The shipped demo.yaml's ``demo:`` section: what ``demo`` runs without --config (its help shows it)."""
    return build(DemoConfig, load_yaml(shipped.CONFIGS / "demo.yaml").get("demo") or {})


_DEMO = _demo_defaults()
DEMO_GROUPS = with_extra(
    train_groups("demo"),
    {
        "Run": (
            Flag(
                ("--workers",),
                "workers",
                "Local worker processes to start.",
                None,
                str(_DEMO.workers),
                kwargs={"type": int, "envvar": envvar("workers")},
            ),
            Flag(("--no-progress",), "no_progress", "No progress bar.", None, kwargs={"is_flag": True}),
        ),
        "Security": (
            Flag(
                ("--secure",),
                "secure",
                "Throw-away logins, topic rights and mutual TLS: the embedded broker as deployed on a LAN.",
                None,
                kwargs={"is_flag": True},
            ),
        ),
        "Advanced / lab": (
            Flag(
                ("--slowdowns",),
                "slowdowns",
                "Compute slowdown per device, central first, e.g. 1,1,6.",
                None,
                ",".join(map(str, _DEMO.slowdowns)) or "none",
            ),
            Flag(
                ("--link-mbps",),
                "link_mbps",
                "Emulated uplink in Mbit/s: one value, or one per device (central first), e.g. 0.5 or 4,1,1.",
                None,
                "none",
            ),
            Flag(
                ("--worker-cpu",),
                "worker_cpu",
                "CPU limit per worker in percent of one core, e.g. "
                "100,50,25: a cgroup v1 CFS quota (root). Unlike --slowdowns it does not scale every "
                "layer alike.",
                None,
                "none",
            ),
            Flag(
                ("--worker-threads",), "worker_threads", "Torch threads per worker, e.g. 1,2.", None, "1 each"
            ),
            Flag(
                ("--kill",),
                "kills",
                "ID@BATCH: SIGKILL worker ID when BATCH starts its backward pass; "
                "ID@evalN: when it takes its N-th evaluation batch; repeatable.",
                None,
                kwargs={"multiple": True},
            ),
        ),
    },
)
CENTRAL_GROUPS = with_extra(
    train_groups("central"),
    {
        "Run": (
            Flag(("--device-id",), "device_id", "This node's device id.", aliases=("--id",)),
            Flag(("--threads",), "threads", "Torch threads.", kwargs={"type": int}),
        ),
        "Cluster and broker": (
            Flag(("--workers",), "workers", "Workers to wait for.", kwargs={"type": int}),
        ),
        "Checkpoints": (
            Flag(
                ("--resume",),
                "resume",
                "Continue the run of this checkpoint file (without it the newest "
                "checkpoint of the cluster's latest run is resumed if that run did not end).",
                kwargs={"type": click.Path(exists=True, dir_okay=False)},
            ),
            Flag(
                ("--fresh",),
                "fresh",
                "Start a new run even if the latest one could be resumed.",
                kwargs={"is_flag": True},
            ),
        ),
        "Advanced / lab": (
            Flag(
                ("--slowdown",),
                "slowdown",
                "Emulate a device this many times slower (>= 1).",
                kwargs={"type": float},
            ),
            Flag(
                ("--die-after-checkpoint",),
                "die_after_checkpoint",
                "Fault injection: SIGKILL right after writing the N-th checkpoint.",
                kwargs={"type": click.IntRange(min=1), "hidden": True},
            ),
        ),
    },
)


_TRAIN_KEYS = (
    "epochs",
    "model",
    "dataset",
    "batch_size",
    "learning_rate",
    "lr_schedule",
    "lr_gamma",
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
    "prometheus_port",
    "compression",
    "recovery",
    "recovery_mode",
    "chain_every",
    "chain_seconds",
    "global_every",
    "replicas",
    "replica_share",
    "replica_pace_mbps",
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
    "splitfed_server_threads",
    "collective",
    "allreduce_timeout",
    "allreduce_timeout_floor",
    "split",
    "split_point",
    "parallel_batches",
    "max_replicas",
    "replicate_first",
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


def print_config(config: Any, **sections: dict[str, Any]) -> None:
    """``--print-config``: the effective configuration as YAML on stdout (``sections`` first)."""
    data = {**sections, **config.model_dump(mode="json")}
    click.echo(yaml.safe_dump(data, sort_keys=False), nl=False)


def _central_overrides(kw: dict[str, Any]) -> dict[str, Any]:
    train = {k: kw[k] for k in _TRAIN_KEYS if kw.get(k) is not None}
    if kw.get("model_option"):
        train["model_options"] = _model_options(kw["model_option"])
    if kw.get("lr_milestones"):
        train["lr_milestones"] = _ints(kw["lr_milestones"], "--lr-milestones")
    central = {k: kw[k] for k in _CENTRAL_KEYS if kw.get(k) is not None}
    if kw.get("slowdown_changes"):
        central["slowdown_changes"] = list(kw["slowdown_changes"])
    if kw.get("fail_links"):
        central["fail_links"] = list(kw["fail_links"])
    return {**central, "train": train} if train else central


@cloup.command(epilog=ENV_EPILOG, **SETTINGS)
@apply(DEMO_GROUPS)
def demo(**kw: Any) -> None:
    """Broker + central node + local workers: the whole job on this machine."""
    setup_logging(kw["log_level"] or "INFO", device="central")
    # Without --config the demo runs the shipped demo.yaml (its values are the demo's documented ones).
    source = kw["config_file"] or str(shipped.CONFIGS / "demo.yaml")
    base = load_yaml(source)
    section = build(DemoConfig, base.pop("demo", None) or {}, source=f"{source} (demo:)")
    config = build(CentralConfig, merge(base, _central_overrides({**kw, "broker": None})), source=source)
    workers = kw["workers"] if kw["workers"] is not None else section.workers
    slowdowns = _floats(kw["slowdowns"]) or list(section.slowdowns)
    if kw["print_config"]:
        print_config(config, demo={"workers": workers, "slowdowns": slowdowns, "broker": kw["broker"]})
        return
    preflight(config)
    from edgeagent.cli.demo import parse_worker_cpu, parse_worker_threads, run_demo  # torch: after the checks

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


@cloup.command(epilog=ENV_EPILOG, **SETTINGS)
@apply(CENTRAL_GROUPS)
def central(**kw: Any) -> None:
    """The central node: holds the data, runs stage 0 and drives the run."""
    setup_logging(kw["log_level"] or "INFO", device=kw["device_id"] or "central")
    overrides = _central_overrides(kw)
    for key in ("workers", "device_id", "slowdown", "threads", "resume", "fresh", "die_after_checkpoint"):
        if kw.get(key) is not None:
            overrides[key] = kw[key]
    base = load_yaml(kw["config_file"]) if kw["config_file"] else {}
    base.setdefault("checkpoint", "auto")  # the central node checkpoints unless told not to
    config = build(CentralConfig, merge(base, overrides), source=kw["config_file"] or "<arguments>")
    if kw["print_config"]:
        print_config(config)
        return
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


@cloup.command(epilog=ENV_EPILOG, **SETTINGS)
@apply(_worker_groups())
def worker(**kw: Any) -> None:
    """A worker: runs whichever stage the central node assigns it."""
    allowed = list(kw.pop("allowed_models"))
    skip = ("config_file", "log_level", "print_config")
    overrides = {k: v for k, v in kw.items() if v is not None and k not in skip}
    if "device_id" not in overrides:
        # The id is the login's user name: --id, else worker.yaml's device_id (the unit passes only
        # --config), else the host name. The host name used to win over the file.
        base = load_yaml(kw["config_file"]) if kw["config_file"] else {}
        overrides["device_id"] = base.get("device_id") or os.uname().nodename.split(".")[0]
    level = kw["log_level"] or "INFO"  # also EDGEAGENT_LOG_LEVEL, what the demo gives its workers
    setup_logging(level, device=overrides["device_id"])
    config = load(WorkerConfig, kw["config_file"], overrides)
    if allowed:  # the flags add to the YAML file's list
        more = build(WorkerConfig, {"allowed_models": allowed}, source="--allow-model").allowed_models
        config = config.model_copy(update={"allowed_models": [*config.allowed_models, *more]})
    if kw["print_config"]:
        print_config(config)
        return
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
