"""Files a run writes (checkpoints, the run record, the report, the trained model, plots): whole or not
at all, and on the disk before the run goes on.

Note: every file a run writes goes through :func:`write_atomic`.
    The bytes go to a temporary file in the target's directory, which is flushed and fsynced, renamed
    over the target, and the directory is fsynced too: after a crash or a power cut (a Pi's SD card, a
    service killed by systemd) the target is either the previous file or the new one, never a torn
    one, and a rename that was acknowledged survives. A write that fails (a full disk: ENOSPC, EFBIG, a
    quota, any OSError) removes its temporary file, leaves the previous file as it was and raises one
    :class:`~edgeagent.errors.StorageError` that names the path, the bytes wanted and the free space;
    the central node logs it as one line and trains on (the next checkpoint may fit).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from edgeagent.errors import StorageError

log = logging.getLogger(__name__)


def free_bytes(folder: str | os.PathLike[str]) -> int | None:
    """Bytes free for this user in ``folder``'s file system (None if it cannot be asked)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable. Some file systems cannot open or fsync a directory: the
    rename has happened all the same, so that is not an error."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes, *, what: str = "file", mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` whole or not at all, durably (see the module's note).

    Raises :class:`StorageError` (the path, the bytes wanted, the free space and the cause) when the
    data cannot be written; the previous file at ``path``, if any, is left as it was and no temporary
    file is left behind. ``what`` names the file in that message (``checkpoint``, ``report``)."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        _remove(tmp)  # first: the free space said is what the next write will find
        tmp = None
        raise StorageError(
            f"cannot write the {what} {target}: {exc.strerror or exc} ({_size(len(data))} wanted, "
            f"{_size(free_bytes(folder))} free in {folder}); the previous {what} is kept"
        ) from exc
    finally:
        _remove(tmp)  # interrupted (SIGTERM raises here too): no torn temporary file left behind
    _fsync_dir(folder)


def _remove(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def torch_bytes(obj: Any) -> bytes:
    """``torch.save(obj)`` in memory: the size is known before anything touches the disk, and the disk
    sees one write (:func:`write_atomic`)."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def state_directory() -> Path:
    """Where this program keeps state: systemd's ``$STATE_DIRECTORY`` (``StateDirectory=``; the first
    when it lists several), else ``$XDG_STATE_HOME/edgeagent``, else ``~/.local/state/edgeagent``."""
    given = os.environ.get("STATE_DIRECTORY", "")
    if given:
        return Path(given.split(":")[0])
    xdg = os.environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "edgeagent"


__all__ = ["free_bytes", "state_directory", "torch_bytes", "write_atomic"]
