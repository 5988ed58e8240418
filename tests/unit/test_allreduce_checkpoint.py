"""Reading a central node's checkpoint (``--resume``): a malformed file is one clear error, never a crash
or an unpickled object."""

from __future__ import annotations

import fractions
from pathlib import Path

import pytest
import torch

from edgeagent.errors import TrainingError
from edgeagent.roles.central.checkpoint_file import load_checkpoint, resume_of, save_checkpoint


def test_a_checkpoint_round_trips_with_its_format(tmp_path: Path) -> None:
    path = str(tmp_path / "c.ckpt")
    save_checkpoint(path, {"mode": "allreduce", "step": 3, "weights": torch.arange(4.0)})
    state = load_checkpoint(path)
    assert state["format"] == 1 and state["step"] == 3 and torch.equal(state["weights"], torch.arange(4.0))
    assert not (tmp_path / "c.ckpt.tmp").exists()  # written aside, then moved into place
    assert resume_of(state, "allreduce", ("step", "weights")) is state


def test_garbage_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(TrainingError, match=r"cannot read the checkpoint .*c\.ckpt"):
        load_checkpoint(str(path))


def test_an_arbitrary_object_is_not_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    torch.save({"format": 1, "x": fractions.Fraction(1, 3)}, path)  # not a tensor or plain data
    with pytest.raises(TrainingError, match="cannot read the checkpoint"):
        load_checkpoint(str(path))


def test_a_plain_dict_of_another_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(TrainingError, match=r"not an edgeagent checkpoint \(format 1\)"):
        load_checkpoint(str(path))


def test_a_checkpoint_of_another_mode_or_lacking_keys_is_refused() -> None:
    with pytest.raises(TrainingError, match="of a split-federated run, not of a allreduce one"):
        resume_of({"format": 1, "mode": "split-federated"}, "allreduce", ())
    with pytest.raises(TrainingError, match=r"of a pipeline run"):
        resume_of({"format": 1, "version": 4}, "allreduce", ())
    with pytest.raises(TrainingError, match=r"lacks \['weights'\]"):
        resume_of({"format": 1, "mode": "allreduce", "step": 2}, "allreduce", ("step", "weights"))
