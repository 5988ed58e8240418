"""The audit log of applied updates (pipeline/audit.py): the lineage check on hand-made event sequences,
and what a real stage writes when the log is on (and nothing when it is off)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from edgeagent.models import ModelSpec
from edgeagent.pipeline import audit
from edgeagent.pipeline.audit import Event, check
from edgeagent.pipeline.build import make_stage
from edgeagent.protocol.options import TrainOptions


class Clock:
    """Hand-made events in order: each gets the next time stamp."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.t = 0.0

    def build(
        self, pid: int, copy: int, layers: tuple[int, int], version: int, *, seeded: bool = False
    ) -> None:
        self.t += 1
        self.events.append(Event.build(self.t, pid, copy, layers, version, seeded=seeded))

    def apply(self, pid: int, copy: int, batches: range | list[int]) -> None:
        for b in batches:
            self.t += 1
            self.events.append(Event.apply(self.t, pid, copy, b, b))


def two_stages(clock: Clock, upto: int) -> None:
    """Device 1 holds layers [0, 2), device 2 layers [2, 4), both from the seed, batches 0..upto-1."""
    clock.build(1, 1, (0, 2), 0, seeded=True)
    clock.build(2, 1, (2, 4), 0, seeded=True)
    for b in range(upto):
        clock.apply(2, 1, [b])  # the later stage applies first, as in the pipeline
        clock.apply(1, 1, [b])


def test_a_run_without_faults_holds_every_batch_once() -> None:
    clock = Clock()
    two_stages(clock, 10)
    verdict = check(clock.events, total=10, layers=4)
    assert verdict.ok, verdict
    assert verdict.lineages == {layer: list(range(10)) for layer in range(4)}
    assert verdict.lost_count == verdict.twice_count == 0


def test_a_rollback_undoes_the_updates_after_its_version_and_the_replay_applies_them_again() -> None:
    """Device 2 dies after batch 7; both stages roll back to version 5 (a replica) and replay 5..9."""
    clock = Clock()
    two_stages(clock, 8)
    clock.build(1, 2, (0, 2), 5)  # the survivor rebuilds from its own snapshot
    clock.build(3, 1, (2, 4), 5)  # the restarted device (a new process) from its successor's replica
    for b in range(5, 10):
        clock.apply(3, 1, [b])
        clock.apply(1, 2, [b])
    verdict = check(clock.events, total=10, layers=4)
    assert verdict.ok, verdict
    assert verdict.lineages[3] == list(range(10))


def test_a_layer_that_moves_to_another_device_takes_its_lineage_along() -> None:
    """A re-split at batch 6 moves layer 2 from device 2 to device 1 (live weights, no rollback)."""
    clock = Clock()
    two_stages(clock, 6)
    clock.build(1, 2, (0, 3), 6)
    clock.build(2, 2, (3, 4), 6)
    for b in range(6, 12):
        clock.apply(2, 2, [b])
        clock.apply(1, 2, [b])
    verdict = check(clock.events, total=12, layers=4)
    assert verdict.ok, verdict


def test_a_rollback_to_a_version_reached_before_an_older_rollback_finds_that_state() -> None:
    """A central restart resumes its checkpoint of version 6 after a worker fault had rolled the run back
    to 4: the state at 6 is the one the layer had when it was last there, before the fault."""
    clock = Clock()
    two_stages(clock, 8)
    clock.build(1, 2, (0, 2), 4)
    clock.build(2, 2, (2, 4), 4)
    clock.apply(2, 2, [4])
    clock.apply(1, 2, [4])
    clock.build(5, 1, (0, 2), 6)  # the new central process, from the checkpoint of version 6
    clock.build(2, 3, (2, 4), 6)
    for b in range(6, 9):
        clock.apply(2, 3, [b])
        clock.apply(5, 1, [b])
    verdict = check(clock.events, total=9, layers=4)
    assert verdict.ok, verdict


def test_a_placeholder_replaced_before_any_update_is_fine_but_one_that_trains_loses_batches() -> None:
    """Case 2: a restarted device builds its stage from the seed (labelled with the run's version), then the
    switch rebuilds it from a replica. Had it trained on the placeholder, batches 0..4 would be lost."""
    clock = Clock()
    two_stages(clock, 7)
    clock.build(3, 1, (2, 4), 5, seeded=True)
    clock.build(1, 2, (0, 2), 5)
    clock.build(3, 2, (2, 4), 5)
    clock.apply(3, 2, [5, 6])
    clock.apply(1, 2, [5, 6])
    assert check(clock.events, total=7, layers=4).ok

    bad = Clock()
    two_stages(bad, 7)
    bad.build(3, 1, (2, 4), 5, seeded=True)
    bad.build(1, 2, (0, 2), 5)
    bad.apply(3, 1, [5, 6])
    bad.apply(1, 2, [5, 6])
    verdict = check(bad.events, total=7, layers=4)
    assert not verdict.ok
    assert verdict.lost == {2: [0, 1, 2, 3, 4], 3: [0, 1, 2, 3, 4]}
    assert verdict.twice_count == 0
    assert any("lacks batches before" in a for a in verdict.anomalies)


def test_an_update_applied_twice_and_one_skipped_are_counted() -> None:
    clock = Clock()
    two_stages(clock, 4)
    clock.apply(2, 1, [3])  # batch 3 again, no rollback in between
    clock.apply(1, 1, [4])
    clock.apply(2, 1, [6])  # batches 4 and 5 never reach layers 2-3
    verdict = check(clock.events, total=7, layers=4)
    assert not verdict.ok
    assert verdict.twice == {2: [3], 3: [3]}
    assert verdict.lost == {0: [5, 6], 1: [5, 6], 2: [4, 5], 3: [4, 5]}
    assert verdict.out_of_order == {}  # 3 after 3 and 6 after 3: a duplicate and a gap, no step back


def test_a_stopped_device_that_updates_its_old_copy_after_the_re_split_changes_nothing() -> None:
    """SIGSTOP, a re-split without it, SIGCONT: its old copy applies one more batch. The layers' holders
    are the copies that updated them last, and those carry on to the end."""
    clock = Clock()
    two_stages(clock, 5)
    clock.build(1, 2, (0, 4), 5)  # device 2 is gone: device 1 takes every layer at version 5
    clock.apply(2, 1, [5])  # the stopped device wakes and applies batch 5 to its old copy
    clock.apply(1, 2, range(5, 9))
    verdict = check(clock.events, total=9, layers=4)
    assert verdict.ok, verdict


def test_a_build_at_a_version_no_copy_reached_and_a_missing_layer_are_anomalies() -> None:
    clock = Clock()
    clock.build(1, 1, (0, 2), 3)
    verdict = check(clock.events, total=3, layers=3)
    assert any("no copy of it reached" in a for a in verdict.anomalies)
    assert any("layer 2: no copy ever held it" in a for a in verdict.anomalies)
    assert verdict.lost[2] == [0, 1, 2]


# -- the log itself --------------------------------------------------------------------------------


@pytest.fixture
def audit_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "audit"
    monkeypatch.setenv(audit.AUDIT_ENV, str(folder))
    monkeypatch.setattr(audit, "_log_pid", 0)  # opened again from the environment at the next call
    yield folder
    monkeypatch.setattr(audit, "_log_pid", 0)


def _train(batches: int) -> None:
    spec = ModelSpec("mlp", (64,), 10, ())
    stage = make_stage(
        spec, seed=0, start=0, end=6, index=0, num_stages=1, options=TrainOptions(learning_rate=0.05)
    )
    x, y = torch.randn(batches, 8, 64), torch.randint(0, 10, (batches, 8))
    for b in range(batches):
        stage.forward(b, x[b])
        stage.backward(b, labels=y[b])


def test_a_stage_writes_its_build_and_every_update_when_the_log_is_on(audit_dir: Path) -> None:
    _train(3)
    (path,) = audit_dir.glob("*.jsonl")
    lines = path.read_text().splitlines()
    assert '"ev":"process"' in lines[0]
    events = audit.read_dir(audit_dir)
    assert [e.kind for e in events] == ["build", "apply", "apply", "apply"]
    assert events[0].layers == (0, 6) and events[0].seeded and events[0].version == 0
    assert [e.batch for e in events[1:]] == [0, 1, 2]
    assert check(events, total=3, layers=6).ok


def test_nothing_is_written_when_the_log_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(audit.AUDIT_ENV, raising=False)
    monkeypatch.setattr(audit, "_log_pid", 0)
    monkeypatch.chdir(tmp_path)
    _train(2)
    assert audit.current() is None
    assert not list(tmp_path.rglob("*.jsonl"))


def test_a_torn_last_line_is_skipped() -> None:
    assert audit.parse_line('{"t":1.0,"pid":1,"ev":"apply","copy":1,"b":') is None
    assert audit.parse_line('{"t":1.0,"pid":1,"ev":"process","argv":[]}') is None


def test_updates_applied_out_of_order_are_reported() -> None:
    clock = Clock()
    clock.build(1, 1, (0, 1), 0, seeded=True)
    clock.apply(1, 1, [0, 1])
    clock.events.append(Event.apply(clock.t + 1, 1, 1, 3, 2))  # batch 3 at version 2
    clock.events.append(Event.apply(clock.t + 2, 1, 1, 2, 3))
    verdict = check(clock.events, total=4, layers=1)
    assert verdict.lineages[0] == [0, 1, 3, 2]
    assert verdict.out_of_order == {0: 3}
    assert verdict.lost_count == verdict.twice_count == 0
    assert not verdict.ok
