"""The central node's run on disk: which run this process trains (its own latest one, resumed by itself,
or a new one), the cluster's run record of what became of it, its checkpoints, and SIGTERM's suspension
(:mod:`.runs` holds the directory's layout and rules)."""

from __future__ import annotations

import logging
import os
import signal
import uuid
from collections.abc import Callable
from typing import Any

from edgeagent.config import CentralConfig
from edgeagent.errors import StorageError
from edgeagent.roles.central.checkpoint_file import checkpoint_version, load_checkpoint
from edgeagent.roles.central.runs import RunDirectory, RunOutcome, RunRecord

log = logging.getLogger("edgeagent.roles.central")

EventHook = Callable[..., None]  # the node's ``event(name, **details)``: run/events


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def pick_run(
    config: CentralConfig, runs: RunDirectory | None, settings: str
) -> tuple[str, dict[str, Any] | None, str | None]:
    """(run id, loaded checkpoint, its path): ``--resume FILE``'s; else the cluster's latest run if it
    can be resumed (:mod:`.runs`: a restart goes on with its own run by itself); else a new run."""
    if config.resume:
        state = load_checkpoint(config.resume)
        return str(state["run_id"]), state, config.resume
    found = None if runs is None or config.fresh else runs.resumable(settings)
    if found is None:
        return new_run_id(), None, None
    if found.state is None or found.path is None:
        log.warning(
            "run %s stopped before its first checkpoint: starting it again from its first batch, under "
            "its own id so that its workers rejoin (--fresh: a new run)",
            found.run_id,
        )
        return found.run_id, None, None
    log.info(
        "resuming run %s from its checkpoint %s (version %s); --fresh starts a new run instead",
        found.run_id,
        found.path,
        checkpoint_version(found.state),
    )
    return found.run_id, found.state, str(found.path)


class RunKeeper:
    """Writes the run's record and checkpoints under ``runs`` (None: ``--checkpoint`` is off) and tells
    monitors about them through ``event``; ``die_after`` is ``--die-after-checkpoint`` (fault injection),
    ``flush`` delivers what was sent before that SIGKILL."""

    def __init__(
        self,
        runs: RunDirectory | None,
        run_id: str,
        settings: str,
        *,
        event: EventHook,
        flush: Callable[[float], object],
        die_after: int | None = None,
    ) -> None:
        self.runs = runs
        self.run_id = run_id
        self.settings = settings
        self.event = event
        self.flush = flush
        self.die_after = die_after
        self.written = 0  # checkpoints written by this process (--die-after-checkpoint counts them)

    def record(self, outcome: RunOutcome) -> None:
        """The cluster's run record: this run and what became of it (a restart reads it: :mod:`.runs`)."""
        if self.runs is not None:
            self.runs.set_record(RunRecord(self.run_id, self.settings, outcome))

    def save(self, version: int, state: dict[str, Any], what: str) -> bool:
        """Write the run's checkpoint of ``version`` (:meth:`RunDirectory.save`); a disk that refuses it is
        one error line and the run trains on (the previous checkpoint stays, the next one may fit)."""
        if self.runs is None:
            return False
        try:
            path = self.runs.save(self.run_id, version, state)
        except StorageError as exc:
            log.error("%s; training goes on", exc)
            self.event("checkpoint-failed", version=version, reason=str(exc))
            return False
        if path is None:
            return False
        self.checkpoint_written(str(path), what, version)
        return True

    def checkpoint_written(self, path: str, what: str, version: int) -> None:
        """Log and announce a checkpoint the run wrote; ``--die-after-checkpoint N`` (fault injection):
        SIGKILL this process right after the N-th, what it sent before delivered first."""
        log.info("checkpoint %s written to %s", what, path)
        self.event("checkpoint", version=version, path=path)
        self.written += 1
        if self.die_after == self.written:
            log.warning("fault injection: SIGKILL after checkpoint %d (%s)", self.written, what)
            self.flush(5.0)
            os.kill(os.getpid(), signal.SIGKILL)

    def suspend(self, active: object) -> None:
        """SIGTERM: the newest consistent state on disk (the mode's run ``active`` writes it if it holds a
        newer one than its last checkpoint), and the run said to be suspended, not finished."""
        write = getattr(active, "checkpoint_newest", None)  # the pipeline modes: replication points
        version = None
        try:
            version = write() if callable(write) else None
        except Exception:  # a bug here must not keep the run from being said suspended, nor the exit
            log.exception("SIGTERM: the newest state could not be checkpointed; the last checkpoint stands")
        if version is None and self.runs is not None:
            version = self.runs.newest(self.run_id)
        where = ""
        if version is not None and self.runs is not None:
            where = str(self.runs.run_folder(self.run_id) / f"v{version:08d}.ckpt")
        self.event("run-suspended", version=version, checkpoint=where, reason="SIGTERM")
        if where:
            log.warning(
                "SIGTERM: run %s suspended at version %d (%s); start the central node again with the same "
                "configuration to resume it (--fresh: a new run)",
                self.run_id,
                version,
                where,
            )
        else:
            log.warning(
                "SIGTERM: run %s suspended before its first checkpoint%s; starting the central node again "
                "starts it from its first batch",
                self.run_id,
                "" if self.runs is not None else " (checkpoints are off: --checkpoint DIR)",
            )


__all__ = ["RunKeeper", "new_run_id", "pick_run"]
