"""Atomic, durable writes (edgeagent.ops.files): whole or not at all, fsynced, and a clear error when the
disk refuses, with the previous file kept."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from edgeagent.errors import StorageError
from edgeagent.ops import files
from edgeagent.ops.files import state_directory, write_atomic


def test_a_write_replaces_the_file_whole_and_fsyncs_file_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "report.json"
    target.write_bytes(b"old")
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    write_atomic(target, b"new" * 1000, what="report", mode=0o600)
    assert target.read_bytes() == b"new" * 1000
    assert len(synced) == 2  # the file, then the directory its rename is in
    assert oct(target.stat().st_mode & 0o777) == oct(0o600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary file


def test_a_full_disk_keeps_the_previous_file_and_says_path_size_and_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "v00000040.ckpt"
    target.write_bytes(b"previous checkpoint")
    written = 0

    def write(fd: int, data: memoryview) -> int:  # the disk fills after 4 kB
        nonlocal written
        if written >= 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(len(data), 1024)
        written += n
        return os.pwrite(fd, bytes(data[:n]), written - n)

    monkeypatch.setattr(files.os, "write", write)
    monkeypatch.setattr(files, "free_bytes", lambda folder: 12_000)
    with pytest.raises(StorageError) as caught:
        write_atomic(target, b"x" * 2_500_000, what="checkpoint")
    message = str(caught.value)
    assert str(target) in message and "No space left on device" in message
    assert "2.5 MB wanted" in message and "12.0 kB free" in message
    assert "\n" not in message  # one line
    assert target.read_bytes() == b"previous checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v00000040.ckpt"]


def test_a_missing_directory_is_a_storage_error_too(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="cannot write the model"):
        write_atomic(tmp_path / "gone" / "model.pt", b"x", what="model")


def test_an_interrupted_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM raises wherever the central node is, the middle of a checkpoint write included."""

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "v1.ckpt", b"data")
    assert list(tmp_path.iterdir()) == []


def test_the_state_directory_is_systemds_then_xdgs_then_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/a:{tmp_path}/b")
    assert state_directory() == tmp_path / "a"
    monkeypatch.delenv("STATE_DIRECTORY")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_directory() == tmp_path / "xdg" / "edgeagent"
    monkeypatch.setenv("XDG_STATE_HOME", "relative")  # the XDG spec: ignored unless absolute
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_directory() == tmp_path / "home" / ".local" / "state" / "edgeagent"
