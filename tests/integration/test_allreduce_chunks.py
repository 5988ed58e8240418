"""The ft-tree's exchange by chunks through a real broker (issue 54): a model of more than one chunk
(:data:`~edgeagent.allreduce.chunks.CHUNK_FLOATS`), four devices, a failed link for one step: the
replicas stay identical, every member counts once, and the model is the exact mean of every step's
gradients (the single-process reference of tests/integration/test_allreduce.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.allreduce.chunks import CHUNK_FLOATS, count
from tests.integration import test_allreduce as base

pytestmark = pytest.mark.slow

HIDDEN = [4096]  # 64-4096-10: 307,210 parameters, two chunks


def test_ft_tree_by_chunks_through_a_failed_link_is_exact(
    mosquitto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "HIDDEN", HIDDEN)
    monkeypatch.setattr(base, "TRAIN", base.TRAIN.model_copy(update={"model_options": {"hidden": HIDDEN}}))
    assert count(64 * 4096 + 4096 + 4096 * 10 + 10, CHUNK_FLOATS) == 2
    saved = tmp_path / "model.pt"
    report, _ = base.run(mosquitto_url, 4, 4, saved, fail_links=["worker-2,worker-4@1:2"])
    assert report.allreduce["collective"] == "ft-tree"
    base.check_steps(report, 4)
    iterations = report.allreduce["iterations"]
    assert [bool(it["failed_links"]) for it in iterations] == [False, True, True, False]
    assert iterations[-1]["dropped"] > 0
    base.check_model(report, saved)
