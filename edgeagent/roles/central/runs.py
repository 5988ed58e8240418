"""The central node's runs on disk: checkpoints named by run and version, the cluster's run record, and
the run a restarted central node resumes by itself.

Under the checkpoint directory (``--checkpoint DIR``; ``auto``: ``checkpoints`` in the state directory,
:func:`edgeagent.ops.files.state_directory`)::

    <dir>/<cluster>/run.json                  the cluster's latest run: id, settings digest, state
    <dir>/<cluster>/<run id>/v00000120.ckpt   its checkpoints by version, the last ``keep`` of them

Note: a restarted central node resumes its own run, and no run overwrites another's checkpoints.
    A checkpoint's name holds its run id and version, so two runs never share a file, and within a run
    a version is written only above the newest on disk (a rollback or a second incarnation never puts
    an older state in front of a newer one); only the run's own oldest files are removed. ``run.json``
    is the cluster's latest run and what became of it: ``running`` (a crash or SIGKILL leaves it so),
    ``suspended`` (SIGTERM), ``finished`` or ``diverged``. A central node started with the same
    settings (:func:`settings_digest`: the mode and the training section, what the run computes) as a
    ``running`` or ``suspended`` latest run takes that run's id and its newest checkpoint that loads
    (one that does not is set aside as ``.corrupt`` with a warning, and the one before is taken);
    ``--fresh``, other settings, or a run that ended start a new run, which becomes the latest. A run
    that wrote no checkpoint yet is started again from its first batch under its own id. Keeping the
    id is what brings the workers back: those still in the run answer the discovery of their own run,
    and the ``Assign`` from the checkpoint replaces their stage (the pipeline's
    :mod:`edgeagent.modes.pipeline.worker.session`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from edgeagent.config import CentralConfig
from edgeagent.errors import StorageError, TrainingError
from edgeagent.ops.files import state_directory, write_atomic

log = logging.getLogger("edgeagent.roles.central")

RunOutcome = Literal["running", "suspended", "finished", "diverged"]
RESUMABLE: tuple[RunOutcome, ...] = ("running", "suspended")
RECORD = "run.json"
_CHECKPOINT = re.compile(r"^v(\d{1,12})\.ckpt$")
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def settings_digest(config: CentralConfig) -> str:
    """What a run computes, as configured (the training section, the mode and its collective and data
    split): a restarted central node resumes the latest run only if this is the same."""
    chosen = {
        "mode": config.mode,
        "train": config.train.model_dump(mode="json"),
        "collective": config.collective,
        "split": config.split,
    }
    return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:16]


def checkpoint_root(value: str | None) -> Path | None:
    """The directory ``--checkpoint`` names: None when off; ``auto``: the state directory's
    ``checkpoints``. A file name ending in ``.ckpt`` (``--checkpoint FILE``, before run-named files) is
    taken as its directory."""
    if not value:
        return None
    if value == "auto":
        return state_directory() / "checkpoints"
    path = Path(value).expanduser()
    return path.parent if path.suffix == ".ckpt" and not path.is_dir() else path


def _folder_name(cluster: str) -> str:
    # Cluster names are 1-64 of A-Z a-z 0-9 _ . - (protocol.topics.check_name): only "." and ".." need care.
    return f"_{cluster}" if cluster.strip(".") == "" else cluster


@dataclass(frozen=True)
class RunRecord:
    """``run.json``: the cluster's latest run and what became of it."""

    run_id: str
    settings: str
    state: RunOutcome

    def to_json(self) -> bytes:
        data = {"format": 1, **self.__dict__}
        return (json.dumps(data, indent=2) + "\n").encode()


@dataclass(frozen=True)
class Resumable:
    """The run a restarted central node goes on with: its id and its newest checkpoint that loads (None:
    it wrote none yet), loaded."""

    run_id: str
    path: Path | None
    state: dict[str, Any] | None


class RunDirectory:
    """One cluster's runs under the checkpoint directory (see the module's note)."""

    def __init__(self, root: Path, cluster: str, *, keep: int) -> None:
        self.root = root
        self.folder = root / _folder_name(cluster)
        self.keep = keep

    @classmethod
    def of(cls, config: CentralConfig) -> RunDirectory | None:
        """The run directory ``config`` asks for (None: checkpoints are off)."""
        root = checkpoint_root(config.checkpoint)
        if root is None:
            return None
        if (
            config.checkpoint
            and Path(config.checkpoint).suffix == ".ckpt"
            and root != Path(config.checkpoint)
        ):
            log.warning(
                "--checkpoint %s: checkpoints are run-named files now; they go to %s/%s/<run id>/",
                config.checkpoint,
                root,
                _folder_name(config.cluster),
            )
        return cls(root, config.cluster, keep=config.keep_checkpoints)

    def run_folder(self, run_id: str) -> Path:
        if not _RUN_ID.match(run_id):
            raise TrainingError(f"run id {run_id!r} is not 1-64 of A-Z a-z 0-9 _ -")
        return self.folder / run_id

    # -- the record ----------------------------------------------------------------------------

    def record(self) -> RunRecord | None:
        """The cluster's latest run, or None (none yet, or a record that does not parse: said in the log)."""
        path = self.folder / RECORD
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("cannot read the run record %s (%s): starting a new run", path, exc)
            return None
        try:
            record = RunRecord(str(data["run_id"]), str(data["settings"]), data["state"])
        except (KeyError, TypeError) as exc:
            log.warning("the run record %s lacks %s: starting a new run", path, exc)
            return None
        if record.state not in get_args(RunOutcome) or not _RUN_ID.match(record.run_id):
            log.warning("the run record %s is not one this version writes: starting a new run", path)
            return None
        return record

    def set_record(self, record: RunRecord) -> bool:
        """Write ``run.json``; a disk that refuses is logged (one line) and the run goes on."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_atomic(self.folder / RECORD, record.to_json(), what="run record")
        except StorageError as exc:
            log.error("%s", exc)
            return False
        except OSError as exc:
            log.error("cannot create %s: %s; the run goes on without its record", self.folder, exc.strerror)
            return False
        return True

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoints(self, run_id: str) -> list[tuple[int, Path]]:
        """The run's checkpoints on disk, oldest first."""
        try:
            names = [p for p in self.run_folder(run_id).iterdir() if p.is_file()]
        except FileNotFoundError:
            return []
        found = []
        for path in names:
            match = _CHECKPOINT.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found)

    def newest(self, run_id: str) -> int | None:
        """The version of the run's newest checkpoint on disk (None: none)."""
        found = self.checkpoints(run_id)
        return found[-1][0] if found else None

    def save(self, run_id: str, version: int, state: dict[str, Any]) -> Path | None:
        """Write the run's checkpoint of ``version`` (a format-1 checkpoint of ``state``) and keep the last
        ``keep``; None when the run already has one of this version or a newer one (versions never go
        backwards). Raises :class:`StorageError` when the disk refuses: the previous ones stay."""
        newest = self.newest(run_id)
        if newest is not None and version <= newest:
            log.info("checkpoint of version %d not written: run %s has version %d", version, run_id, newest)
            return None
        from edgeagent.roles.central.checkpoint_file import save_checkpoint  # torch

        folder = self.run_folder(run_id)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the checkpoint directory {folder}: {exc.strerror}") from exc
        path = folder / f"v{version:08d}.ckpt"
        save_checkpoint(str(path), state)
        self._prune(run_id)
        return path

    def _prune(self, run_id: str) -> None:
        """Remove the run's checkpoints beyond the last ``keep``, and temporary files a killed write left."""
        folder = self.run_folder(run_id)
        stale = [p for p in folder.glob(".v*.ckpt.*.tmp")]
        old = [path for _, path in self.checkpoints(run_id)[: -self.keep]]
        for path in [*stale, *old]:
            try:
                path.unlink()
            except OSError as exc:
                log.warning("cannot remove the old checkpoint %s: %s", path, exc.strerror)

    # -- which run to resume -------------------------------------------------------------------

    def resumable(self, settings: str) -> Resumable | None:
        """The cluster's latest run if a central node with these ``settings`` goes on with it (see the
        module's note), with its newest checkpoint that loads; None for a new run (the log says why)."""
        record = self.record()
        if record is None:
            return None
        if record.state not in RESUMABLE:
            log.info("the latest run %s of this cluster %s: starting a new run", record.run_id, record.state)
            return None
        if record.settings != settings:
            log.warning(
                "the latest run %s of this cluster (%s) was started with other training settings: starting "
                "a new run (its checkpoints stay in %s; --resume FILE continues it)",
                record.run_id,
                record.state,
                self.run_folder(record.run_id),
            )
            return None
        from edgeagent.roles.central.checkpoint_file import load_checkpoint  # torch

        for _, path in reversed(self.checkpoints(record.run_id)):
            try:
                state = load_checkpoint(str(path))
            except TrainingError as exc:
                aside = path.with_name(path.name + ".corrupt")
                log.warning("%s; set aside as %s, trying the one before", exc, aside.name)
                with contextlib.suppress(OSError):
                    path.rename(aside)
                continue
            if state.get("run_id") != record.run_id:
                log.warning("%s holds run %s, not %s: skipped", path, state.get("run_id"), record.run_id)
                continue
            return Resumable(record.run_id, path, state)
        return Resumable(record.run_id, None, None)


def latest_checkpoint(folder: str | Path, cluster: str, run_id: str | None = None) -> Path | None:
    """The newest checkpoint of ``run_id`` (default: the cluster's latest run) under the checkpoint
    directory ``folder``: what ``--resume`` takes by hand."""
    runs = RunDirectory(Path(folder), cluster, keep=1)
    if run_id is None:
        record = runs.record()
        if record is None:
            return None
        run_id = record.run_id
    found = runs.checkpoints(run_id)
    return found[-1][1] if found else None


__all__ = [
    "RESUMABLE",
    "Resumable",
    "RunDirectory",
    "RunOutcome",
    "RunRecord",
    "checkpoint_root",
    "latest_checkpoint",
    "settings_digest",
]
