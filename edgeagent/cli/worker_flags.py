"""``worker``'s options in their groups (see :mod:`edgeagent.cli.flags` for the rules)."""

from __future__ import annotations

import click

from edgeagent.cli.flags import CONFIG, Flag, Group, choice
from edgeagent.cli.train_flags import CLUSTER, CONFIG_FLAGS, LOG_LEVEL, SECURITY
from edgeagent.config import WorkerConfig

W = WorkerConfig

WORKER_FLAGS = (
    Flag(
        ("--device-id",),
        "device_id",
        "Device id (also the broker login).",
        W,
        default="the host name",
        aliases=("--id",),
    ),
    Flag(("--threads",), "threads", "Torch threads.", W, kwargs={"type": int}),
    Flag(
        ("--memory-limit-mb",),
        "memory_limit_mb",
        "Memory the stage may use here (0: no limit); the split respects it.",
        W,
        kwargs={"type": float},
    ),
    Flag(("--once",), "once", "Exit after one run.", W, kwargs={"is_flag": True}),
    Flag(
        ("--allow-model",),
        "allowed_models",
        "PKG.MOD:FUNC: a user model this worker may build "
        "(repeatable; added to allowed_models). Built-in models need none.",
        W,
        kwargs={"multiple": True, "metavar": "PKG.MOD:FUNC"},
    ),
)
WORKER_CLUSTER = (
    Flag(
        ("--heartbeat-interval",),
        "heartbeat_interval",
        "Seconds between heartbeats.",
        W,
        kwargs={"type": float},
    ),
    Flag(
        ("--central-offline-floor",),
        "central_offline_floor",
        "Seconds the run's central node may stay "
        "offline before this device leaves the run, at least (the window is 10 of its heartbeats).",
        W,
        kwargs={"type": click.FloatRange(min=0, min_open=True)},
    ),
)
WORKER_SPLITFED = (
    Flag(("--dataset",), "dataset", "This device's own training data (FILE.npz with X and y).", W),
    Flag(
        ("--down-mbps",),
        "down_mbps",
        "Emulated downlink in Mbit/s (0: the real link).",
        W,
        kwargs={"type": float},
    ),
)
WORKER_LAB = (
    Flag(
        ("--slowdown",),
        "slowdown",
        "Emulate a device this many times slower (>= 1).",
        W,
        kwargs={"type": float},
    ),
    Flag(
        ("--link-mbps",),
        "link_mbps",
        "Emulated uplink in Mbit/s (0: the real link).",
        W,
        kwargs={"type": float},
    ),
    Flag(
        ("--characterise-budget",),
        "characterise_budget",
        "Seconds measuring this device's speed for a model may take.",
        W,
        kwargs={"type": float},
    ),
    Flag(
        ("--characterise-rounds",),
        "characterise_rounds",
        "Windows per sub-model measured, the fastest taken.",
        W,
        kwargs={"type": click.IntRange(1, 16)},
    ),
    Flag(
        ("--die-at-backward",),
        "die_at_backward",
        "Fault injection: SIGKILL at this backward.",
        W,
        kwargs={"type": int, "hidden": True},
    ),
    Flag(
        ("--die-at-eval",),
        "die_at_eval",
        "Fault injection: SIGKILL at the N-th eval batch.",
        W,
        kwargs={"type": int, "hidden": True},
    ),
    Flag(
        ("--send-nan",),
        "send_nan",
        "Fault injection: NaN in what it sends (KIND@BATCH[+]).",
        W,
        kwargs={"hidden": True},
    ),
    Flag(
        ("--nan-on-usr1",),
        "nan_on_usr1",
        "Fault injection: each SIGUSR1 fills the next message of this kind it sends with NaN.",
        W,
        kwargs={"type": choice("activation", "gradient", "replica", "sync"), "hidden": True},
    ),
)


def _for_worker(flag: Flag) -> Flag:
    return Flag(flag.decls, flag.key, flag.help, W, flag.default, flag.aliases, flag.kwargs)


def worker_groups() -> list[Group]:
    return [
        Group("Run", (CONFIG, *CONFIG_FLAGS, *WORKER_FLAGS, LOG_LEVEL)),
        Group("Cluster and broker", (*(_for_worker(f) for f in CLUSTER[:2]), *WORKER_CLUSTER)),
        Group("Security", tuple(_for_worker(f) for f in SECURITY)),
        Group("Split-federated (--mode split-federated only)", WORKER_SPLITFED),
        Group("Advanced / lab: emulation and fault injection", WORKER_LAB),
    ]
