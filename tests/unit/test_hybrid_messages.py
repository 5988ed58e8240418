"""Hybrid-stage fields of the messages (groups, shares, rows): round trips and consistency checks on
decode."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import cbor2
import pytest
import torch

from edgeagent.errors import ProtocolError
from edgeagent.protocol.commands import COMMAND_TYPES, Reshare
from edgeagent.protocol.messages import (
    Activation,
    Assign,
    EvalResult,
    Gradient,
    GradSync,
    Message,
    MessageKind,
    Repartition,
)
from edgeagent.protocol.wire import decode, encode
from tests.unit.protocol_samples import (
    GEN,
    HAND_SAMPLES,
    SAMPLES,
    assert_same_message,
    drop,
    put,
    reencode,
)

# Hybrid stages: a stage held by a group of devices (primary first), each computing its share of every
# batch's rows; the members exchange parameter gradients (grad_sync) and the central node reshares.

HYBRID_SAMPLES: dict[str, Message] = {
    "assign": dataclasses.replace(
        typing.cast(Assign, HAND_SAMPLES[MessageKind.ASSIGN]),
        groups=[["central"], ["w1", "w3"], ["w2"]],
        shares=[[1.0], [0.625, 0.375], [1.0]],
        share_version=2,
    ),
    "repartition": dataclasses.replace(
        typing.cast(Repartition, HAND_SAMPLES[MessageKind.REPARTITION]),
        groups=[["central"], ["w2", "w1"]],
        shares=[[1.0], [0.5, 0.5]],
    ),
    "activation": Activation(
        run_id="run-1",
        plan_id=3,
        stage=0,
        batch_id=17,
        version=4,
        mode="train",
        x=torch.randn(3, 8, generator=GEN),
        y=torch.tensor([1, 0, 3]),
        rows=[5, 8],
        total=8,
    ),
    "gradient": Gradient(
        run_id="run-1",
        plan_id=3,
        stage=1,
        batch_id=17,
        g=torch.randn(3, 8, generator=GEN),
        loss=1.75,
        correct=2,
        stage_times=[0.01],
        rows=[5, 8],
        total=8,
        row_loss=[0.5, 0.25, 1.0],
        row_correct=[1, 1, 0],
        device_times={"w1": 0.02, "w3": 0.035},
    ),
    "eval_result": EvalResult(
        run_id="run-1", plan_id=3, batch_id=2, correct=3, count=4, loss_sum=1.5, rows=[0, 4], total=8
    ),
    "grad_sync": GradSync(
        run_id="run-1",
        plan_id=3,
        stage=1,
        batch_id=17,
        share_version=2,
        device_id="w3",
        rows=[5, 8],
        total=8,
        grads={"2.weight": torch.randn(4, 3, generator=GEN), "2.bias": torch.zeros(4)},
    ),
    "reshare": Reshare(
        run_id="run-1",
        plan_id=3,
        share_version=3,
        worker_list=["central", "w1", "w2"],
        groups=[["central"], ["w1"], ["w2"]],
        shares=[[1.0], [1.0], [1.0]],
    ),
}


@pytest.mark.parametrize("name", list(HYBRID_SAMPLES))
def test_hybrid_messages_round_trip(name: str) -> None:
    msg = HYBRID_SAMPLES[name]
    sender, out = decode(encode(msg, sender="w3"))
    assert sender == "w3" and type(out) is type(msg)
    assert_same_message(msg, out)


def test_grad_sync_is_cbor_and_reshare_a_json_command() -> None:
    sync = cbor2.loads(encode(HYBRID_SAMPLES["grad_sync"], sender="w3"))
    assert sync["k"] == "grad_sync" and sync["b"]["rows"] == [5, 8] and sync["b"]["total"] == 8
    reshare = json.loads(encode(HYBRID_SAMPLES["reshare"], sender="central"))
    assert reshare["k"] == "command" and reshare["b"]["name"] == "reshare"
    assert reshare["b"]["args"]["groups"] == [["central"], ["w1"], ["w2"]]
    assert COMMAND_TYPES["reshare"] is Reshare
    # Without hybrid fields, the data plane is as before: the whole batch, one device per stage.
    plain, assign = SAMPLES[MessageKind.ACTIVATION], SAMPLES[MessageKind.ASSIGN]
    assert isinstance(plain, Activation) and plain.rows == [] and plain.total == 0
    assert isinstance(assign, Assign) and assign.groups == [] and assign.shares == []


BAD_HYBRID = [
    # (id, sample, mutation, regex the error must match)
    (
        "rows-reversed",
        "activation",
        put(("b", "rows"), [3, 2]),
        r"activation of batch 17: rows \[3, 2\] must",
    ),
    ("rows-empty-span", "activation", put(("b", "rows"), [4, 4]), r"rows \[4, 4\] must be \[lo, hi\]"),
    ("rows-beyond-total", "activation", put(("b", "rows"), [5, 9]), r"rows \[5, 9\].*<= total 8"),
    ("rows-negative", "activation", put(("b", "rows"), [-1, 3]), r"rows \[-1, 3\].*0 <= lo"),
    ("rows-one-number", "activation", put(("b", "rows"), [3]), r"rows \[3\] must be \[lo, hi\]"),
    ("rows-not-ints", "activation", put(("b", "rows"), [0, "3"]), r"activation\.rows\[1\]: expected int"),
    ("gradient-rows", "gradient", put(("b", "total"), 7), r"gradient of batch 17: rows \[5, 8\].*total 7"),
    (
        "row-loss-short",
        "gradient",
        put(("b", "row_loss"), [0.5, 0.25]),
        r"gradient of batch 17: 2 row losses and 3 row results for 3 rows",
    ),
    (
        "row-correct-long",
        "gradient",
        put(("b", "row_correct"), [1, 1, 0, 1]),
        r"3 row losses and 4 row results for 3 rows",
    ),
    (
        "eval-rows",
        "eval_result",
        put(("b", "rows"), [6, 12]),
        r"evaluation result of batch 2: rows \[6, 12\]",
    ),
    ("sync-no-rows", "grad_sync", put(("b", "rows"), []), r"gradient sync of batch 17 names no rows"),
    ("sync-rows", "grad_sync", put(("b", "rows"), [8, 5]), r"gradient sync of batch 17: rows \[8, 5\]"),
    (
        "group-not-primary-first",
        "assign",
        put(("b", "groups"), [["central"], ["w3", "w1"], ["w2"]]),
        r"stage 1: group \['w3', 'w1'\].*must start with its primary 'w1'",
    ),
    (
        "group-twice",
        "assign",
        put(("b", "groups"), [["central"], ["w1", "w1"], ["w2"]]),
        r"stage 1: .*name each device once",
    ),
    (
        "group-empty",
        "assign",
        put(("b", "groups"), [["central"], [], ["w2"]]),
        r"stage 1: group \[\]",
    ),
    (
        "shares-sum",
        "assign",
        put(("b", "shares"), [[1.0], [0.5, 0.25], [1.0]]),
        r"stage 1: shares \[0\.5, 0\.25\] must be in \(0, 1\] and sum to 1",
    ),
    (
        "share-zero",
        "assign",
        put(("b", "shares"), [[1.0], [1.0, 0.0], [1.0]]),
        r"stage 1: shares \[1\.0, 0\.0\] must be in \(0, 1\]",
    ),
    (
        "share-per-member",
        "assign",
        put(("b", "shares"), [[1.0], [1.0], [1.0]]),
        r"stage 1: .*give each a share",
    ),
    (
        "groups-per-stage",
        "assign",
        put(("b", "groups"), [["central"]]),
        r"1 groups and 3 share lists for 3 stages",
    ),
    (
        "shares-without-groups",
        "assign",
        drop(("b", "groups")),
        r"0 groups and 3 share lists for 3 stages",
    ),
    (
        "repartition-primary",
        "repartition",
        put(("b", "groups"), [["central"], ["w1", "w2"]]),
        r"stage 1: group \['w1', 'w2'\].*primary 'w2'",
    ),
    (
        "reshare-primary",
        "reshare",
        put(("b", "args", "groups"), [["central"], ["w2"], ["w1"]]),
        r"stage 1: group \['w2'\].*primary 'w1'",
    ),
    (
        "reshare-shares",
        "reshare",
        put(("b", "args", "shares"), [[1.0], [0.9], [1.0]]),
        r"stage 1: shares \[0\.9\] must .*sum to 1",
    ),
    (
        "reshare-empty",
        "reshare",
        lambda env: env["b"]["args"].update(groups=[], shares=[], worker_list=[]),
        r"reshare names no groups",
    ),
]


@pytest.mark.parametrize(
    ("name", "mutate", "pattern"), [b[1:] for b in BAD_HYBRID], ids=[b[0] for b in BAD_HYBRID]
)
def test_decode_rejects_inconsistent_hybrid_fields(name: str, mutate: Any, pattern: str) -> None:
    with pytest.raises(ProtocolError, match=pattern):
        decode(reencode(HYBRID_SAMPLES[name], mutate))
