"""The central node's runs on disk (edgeagent.roles.central.runs): run-named checkpoints, the last N
kept, versions never going backwards, and which run a restart resumes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgeagent.config import CentralConfig, TrainConfig, build
from edgeagent.errors import StorageError
from edgeagent.roles.central.runs import (
    RunDirectory,
    RunRecord,
    checkpoint_root,
    latest_checkpoint,
    settings_digest,
)


def _state(run_id: str, version: int) -> dict[str, object]:
    return {"run_id": run_id, "version": version, "weights": {"w": torch.full((3,), float(version))}}


def test_checkpoints_are_named_by_run_and_version_and_two_runs_never_share_one(tmp_path: Path) -> None:
    runs = RunDirectory(tmp_path, "lab", keep=3)
    a = runs.save("aaaa", 40, _state("aaaa", 40))
    b = runs.save("bbbb", 40, _state("bbbb", 40))
    assert a == tmp_path / "lab" / "aaaa" / "v00000040.ckpt"
    assert b == tmp_path / "lab" / "bbbb" / "v00000040.ckpt"
    assert torch.load(a, weights_only=True)["run_id"] == "aaaa"
    assert torch.load(b, weights_only=True)["run_id"] == "bbbb"
    assert torch.load(a, weights_only=True)["format"] == 1


def test_the_last_n_are_kept_and_a_version_never_goes_backwards(tmp_path: Path) -> None:
    runs = RunDirectory(tmp_path, "lab", keep=2)
    for version in (20, 40, 60):
        assert runs.save("run1", version, _state("run1", version)) is not None
    assert [v for v, _ in runs.checkpoints("run1")] == [40, 60]
    assert runs.save("run1", 40, _state("run1", 40)) is None  # older than the newest: not written
    assert runs.save("run1", 60, _state("run1", 60)) is None  # written once
    assert [v for v, _ in runs.checkpoints("run1")] == [40, 60]
    assert runs.newest("run1") == 60


def test_a_failed_write_keeps_the_previous_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = RunDirectory(tmp_path, "lab", keep=1)
    runs.save("run1", 20, _state("run1", 20))

    def full(path: str, state: dict[str, object]) -> None:
        raise StorageError(f"cannot write the checkpoint {path}: No space left on device")

    monkeypatch.setattr("edgeagent.roles.central.checkpoint_file.save_checkpoint", full)
    with pytest.raises(StorageError):
        runs.save("run1", 40, _state("run1", 40))
    assert [v for v, _ in runs.checkpoints("run1")] == [20]  # not pruned for a write that failed


def _config(**kw: object) -> CentralConfig:
    return build(CentralConfig, {"cluster": "lab", "checkpoint": "x", **kw})


def test_a_restart_resumes_the_latest_run_only_if_it_did_not_end_and_has_the_same_settings(
    tmp_path: Path,
) -> None:
    runs = RunDirectory(tmp_path, "lab", keep=3)
    settings = settings_digest(_config())
    assert runs.resumable(settings) is None  # nothing yet
    runs.set_record(RunRecord("run1", settings, "running"))
    found = runs.resumable(settings)
    assert found is not None and found.run_id == "run1" and found.path is None  # no checkpoint yet
    runs.save("run1", 20, _state("run1", 20))
    runs.save("run1", 40, _state("run1", 40))
    found = runs.resumable(settings)
    assert found is not None and found.path is not None and found.path.name == "v00000040.ckpt"
    assert found.state is not None and found.state["version"] == 40
    runs.set_record(RunRecord("run1", settings, "suspended"))
    assert runs.resumable(settings) is not None
    other = settings_digest(_config(train=TrainConfig(epochs=9)))
    assert other != settings and runs.resumable(other) is None
    for ended in ("finished", "diverged"):
        runs.set_record(RunRecord("run1", settings, ended))
        assert runs.resumable(settings) is None


def test_a_checkpoint_that_does_not_load_is_set_aside_for_the_one_before(tmp_path: Path) -> None:
    runs = RunDirectory(tmp_path, "lab", keep=3)
    settings = settings_digest(_config())
    runs.set_record(RunRecord("run1", settings, "running"))
    runs.save("run1", 20, _state("run1", 20))
    torn = runs.save("run1", 40, _state("run1", 40))
    assert torn is not None
    torn.write_bytes(torn.read_bytes()[:100])  # a torn file (written before atomic writes)
    found = runs.resumable(settings)
    assert found is not None and found.path is not None and found.path.name == "v00000020.ckpt"
    assert (torn.parent / "v00000040.ckpt.corrupt").exists() and not torn.exists()


def test_a_record_that_does_not_parse_starts_a_new_run(tmp_path: Path) -> None:
    runs = RunDirectory(tmp_path, "lab", keep=3)
    (tmp_path / "lab").mkdir()
    for text in (
        "{",
        '{"run_id": "../x", "settings": "s", "state": "running"}',
        '{"state": "running"}',
        "[]",
    ):
        (tmp_path / "lab" / "run.json").write_text(text)
        assert runs.record() is None


def test_the_checkpoint_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    assert checkpoint_root("auto") == tmp_path / "state" / "checkpoints"
    assert checkpoint_root(None) is None
    assert checkpoint_root(str(tmp_path / "dir")) == tmp_path / "dir"
    assert checkpoint_root(str(tmp_path / "central.ckpt")) == tmp_path  # the old --checkpoint FILE
    for off in (False, "off", "none", ""):
        assert build(CentralConfig, {"checkpoint": off}).checkpoint is None
    assert build(CentralConfig, {"checkpoint": True}).checkpoint == "auto"
    assert CentralConfig().checkpoint is None  # the library's default; `edgeagent central` says auto


def test_the_newest_checkpoint_of_the_latest_run_for_resume_by_hand(tmp_path: Path) -> None:
    runs = RunDirectory(tmp_path, "lab", keep=3)
    assert latest_checkpoint(tmp_path, "lab") is None
    runs.set_record(RunRecord("run1", "s", "finished"))
    runs.save("run1", 20, _state("run1", 20))
    assert latest_checkpoint(tmp_path, "lab") == tmp_path / "lab" / "run1" / "v00000020.ckpt"
