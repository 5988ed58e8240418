"""The files a run reads and writes: checked before it starts (a typo in --report must not cost the
whole run), and the report at its end (written atomically; :mod:`edgeagent.ops.files`)."""

from __future__ import annotations

import json
import logging
import os
import pickle
from pathlib import Path
from typing import Any

from edgeagent.config import CentralConfig
from edgeagent.errors import ConfigError
from edgeagent.ops.files import write_atomic
from edgeagent.ops.logs import console

__all__ = ["finish_report", "preflight"]

log = logging.getLogger("edgeagent")


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


def _check_folder(flag: str, value: str) -> None:
    """The checkpoint directory exists (made if need be, private to this user) and can be written."""
    from edgeagent.roles.central.runs import checkpoint_root

    folder = checkpoint_root(value)
    if folder is None:
        return
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {value}: cannot create {folder} ({exc.strerror}); pick another directory"
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {value}: {folder} is not writable by this user; pick another directory")


def preflight(config: CentralConfig) -> None:
    """The files a run reads and writes, checked before it starts: a typo in --report must not cost the
    whole run. (Loading --init-weights and --resume twice costs a second at start-up; the central node
    loads them again because it is also started without the CLI.)"""
    for flag, path in (("--report", config.report), ("--save-model", config.save_model)):
        if path:
            _check_writable(flag, path)
    if config.checkpoint:
        _check_folder("--checkpoint", config.checkpoint)
    if config.train.init_weights:
        _check_loadable("--init-weights", config.train.init_weights, "a state dict saved with --save-model")
    if config.resume:
        _check_loadable("--resume", config.resume, "a checkpoint written with --checkpoint")


def finish_report(report: Any, path: str | None) -> None:
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
            f"detection; "
            + (
                f"no rollback: the dead stage's layers from their replica of batch {rec['rolled_back_to']}, "
                f"{rec['batches_replayed']} of its batches replayed, resumed at {rec.get('resumed_from')}"
                if rec.get("recovery_mode") == "resume"
                else f"rolled back to batch {rec['rolled_back_to']} ({rec['batches_replayed']} replayed)"
            )
        )
    if path:
        # A disk that refuses it ends the command with one line (StorageError: path, size, free space).
        write_atomic(path, json.dumps(data, indent=2).encode(), what="report")
        console.print(f"report written to {path}")
        try:
            from edgeagent.ops.report import write_plots

            plots = write_plots(data, path)
        except Exception as exc:  # a plotting problem must never cost the user the JSON report
            log.warning("report plots not written: %s", exc)
        else:
            console.print("plots: " + ", ".join(str(p) for p in plots))
