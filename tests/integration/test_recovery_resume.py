"""Recovery without a rollback (``--recovery-mode resume``) with real processes, a real SIGKILL and a real
broker: the dead stage's layers come from its replica and only its lost batches are replayed, on its
layers alone, from what its neighbours sent it; no other stage goes back.

Deterministic: a worker (worker-<k> holds stage k) kills itself with SIGKILL when batch 60 starts its
backward pass there; its chain replica is of batch 50 (``chain_every`` 50).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from edgeagent.config import TrainConfig
from edgeagent.roles.central import RunReport
from tests.helpers import LocalCluster

pytestmark = pytest.mark.slow


def run(
    broker: str,
    *,
    kills: dict[str, int | str] | None = None,
    extra: dict[str, tuple[str, ...]] | None = None,
    save: Path,
    workers: int = 2,
    **central: Any,
) -> RunReport:
    train = TrainConfig(epochs=2, in_flight=1, staleness="none")
    cluster = LocalCluster(
        broker,
        workers=workers,
        worker_options={"kills": kills, "extra": extra},
        train=train,
        save_model=str(save),
        restart_window=0.0,  # the killed worker stays dead: recover without waiting for it
        **central,
    )
    return cluster.run()


def test_the_dead_stage_is_brought_forward_without_a_rollback_and_ends_with_the_fault_free_weights(
    amqtt_url: str, tmp_path: Path
) -> None:
    """With one batch in flight and plain SGD (no staleness) the split does not change the arithmetic,
    so the paper's rule (resume from the first batch whose gradients never came, every update applied
    once) must end with the fault-free run's weights, here without any stage going back."""
    run(amqtt_url, save=tmp_path / "clean.pt")
    faulty = run(amqtt_url, kills={"worker-1": 60}, save=tmp_path / "faulty.pt")

    (rec,) = faulty.recoveries
    assert rec["case"] == 3 and rec["lost"] == ["worker-1"]
    assert rec["recovery_mode"] == "resume", rec["rollback_reason"]
    assert rec["batch"] == 60 and rec["rolled_back_to"] == 50  # the dead stage's chain replica
    # The dead stage's lost updates are those of 50..59, replayed on its layers alone; worker-2, the last
    # stage, had done batch 60 when worker-1 died at its backward: the catch-up finishes 60 too, and
    # training resumes at 61.
    assert rec["batches_replayed"] == 10 and rec["resumed_from"] == 61
    # No batch went through the pipeline twice: every batch id is committed once (a rollback commits
    # 50..59 again).
    counts = Counter(int(row["batch"]) for row in faulty.timeline)
    assert sorted(counts) == list(range(faulty.batches)) and set(counts.values()) == {1}
    clean_w = torch.load(tmp_path / "clean.pt", weights_only=True)
    faulty_w = torch.load(tmp_path / "faulty.pt", weights_only=True)
    assert clean_w.keys() == faulty_w.keys()
    for key in clean_w:
        torch.testing.assert_close(faulty_w[key], clean_w[key], rtol=1e-5, atol=1e-6)


def test_a_recovery_point_older_than_stage_0s_snapshot_asks_for_the_gradients_again(
    amqtt_url: str, tmp_path: Path
) -> None:
    """worker-1's replica of batch 50 carries NaN (``--send-nan replica@50``), so nobody keeps it: the
    recovery point is the seeded start (version 0), older than stage 0's newest snapshot (50), from which
    the central node first asked worker-2 to resend; it asks again from 0, replays 0..59 on the dead
    stage's layers alone, and still ends with the fault-free run's weights."""
    run(amqtt_url, save=tmp_path / "clean.pt")
    faulty = run(
        amqtt_url,
        kills={"worker-1": 60},
        extra={"worker-1": ("--send-nan", "replica@50")},
        save=tmp_path / "faulty.pt",
    )
    (rec,) = faulty.recoveries
    assert rec["recovery_mode"] == "resume", rec["rollback_reason"]
    assert rec["rolled_back_to"] == 0 and rec["batches_replayed"] == 60 and rec["resumed_from"] == 61, rec
    counts = Counter(int(row["batch"]) for row in faulty.timeline)
    assert sorted(counts) == list(range(faulty.batches)) and set(counts.values()) == {1}
    clean_w = torch.load(tmp_path / "clean.pt", weights_only=True)
    faulty_w = torch.load(tmp_path / "faulty.pt", weights_only=True)
    for key in clean_w:
        torch.testing.assert_close(faulty_w[key], clean_w[key], rtol=1e-5, atol=1e-6)


def _no_rollback_and_the_fault_free_weights(faulty: RunReport, dead: str, clean: Path, saved: Path) -> None:
    """The dead stage's 50..59 replayed on its layers alone, batch 60 finished by the catch-up, every batch
    committed once (a rollback commits 50..59 again), and the fault-free run's weights."""
    (rec,) = faulty.recoveries
    assert rec["case"] == 3 and rec["lost"] == [dead]
    assert rec["recovery_mode"] == "resume", rec["rollback_reason"]
    assert rec["batch"] == 60 and rec["rolled_back_to"] == 50
    assert rec["batches_replayed"] == 10 and rec["resumed_from"] == 61, rec
    counts = Counter(int(row["batch"]) for row in faulty.timeline)
    assert sorted(counts) == list(range(faulty.batches)) and set(counts.values()) == {1}
    clean_w = torch.load(clean, weights_only=True)
    faulty_w = torch.load(saved, weights_only=True)
    assert clean_w.keys() == faulty_w.keys()
    for key in clean_w:
        torch.testing.assert_close(faulty_w[key], clean_w[key], rtol=1e-5, atol=1e-6)


def test_a_dead_last_stage_is_replayed_from_the_labelled_activations_without_a_rollback(
    amqtt_url: str, tmp_path: Path
) -> None:
    """worker-2, the last stage, dies at batch 60's backward: no stage after it kept anything. Its loss
    needs only the labels that ride with the activations worker-1 sent it, so the central node replays
    50..60 from those alone and sends worker-1 the input gradients of the batches it still had in flight
    (60), whose own gradients finish stage 0's."""
    run(amqtt_url, save=tmp_path / "clean.pt")
    faulty = run(amqtt_url, kills={"worker-2": 60}, save=tmp_path / "faulty.pt")
    _no_rollback_and_the_fault_free_weights(faulty, "worker-2", tmp_path / "clean.pt", tmp_path / "faulty.pt")


@pytest.mark.parametrize("dead", ["worker-2", "worker-1"])
def test_a_dead_stage_of_four_is_replayed_from_both_neighbours_without_a_rollback(
    amqtt_url: str, tmp_path: Path, dead: str
) -> None:
    """Four stages, ``dead`` dies at batch 60's backward. worker-2 (stage 2): its inputs come from
    worker-1's log (a worker, not stage 0), its output gradients from worker-3's; worker-1 finishes its
    batch in flight with the replay's gradients. worker-1 (stage 1): its successor worker-2 resends only
    once every batch it sent worker-3 came back, so that no stage after it is ahead of it."""
    run(amqtt_url, save=tmp_path / "clean.pt", workers=3)
    faulty = run(amqtt_url, kills={dead: 60}, save=tmp_path / "faulty.pt", workers=3)
    assert len(faulty.partitions[0]["points"]) == 5  # four stages before the fault
    _no_rollback_and_the_fault_free_weights(faulty, dead, tmp_path / "clean.pt", tmp_path / "faulty.pt")
