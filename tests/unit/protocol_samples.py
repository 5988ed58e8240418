"""Samples of every message kind and helpers that compare and break their wire form, shared by the
protocol unit tests (test_messages, test_wire, test_hybrid_messages)."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

import cbor2
import torch

from edgeagent.modes.allreduce.messages import AllreduceDone, AllreduceKind, AllreduceMsg, AllreduceStep
from edgeagent.modes.splitfed.messages import SplitFedKind
from edgeagent.protocol.commands import SetCompression
from edgeagent.protocol.messages import (
    Activation,
    Announce,
    Assign,
    Commit,
    Discover,
    ErrorReport,
    EvalResult,
    Event,
    FetchRequest,
    Gradient,
    Heartbeat,
    Kind,
    LinkReport,
    Message,
    MessageKind,
    Metrics,
    Probe,
    Ready,
    Repartition,
    Status,
    Weights,
)
from edgeagent.protocol.options import TrainOptions
from edgeagent.protocol.wire import MESSAGE_TYPES, encode


def assert_same_tensor(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype
    assert tuple(a.shape) == tuple(b.shape)
    # Bitwise comparison: NaN payloads, -0.0 and infinities must survive unchanged.
    assert a.contiguous().numpy().tobytes() == b.contiguous().numpy().tobytes()


GEN = torch.Generator().manual_seed(0)
_T = torch.arange(6, dtype=torch.float32).reshape(2, 3)

# Hand-written, realistic instances. Kinds added to the protocol later get an automatic sample (below).
# Every kind there is: the shared ones and each mode's (a test that covers "every kind" covers these).
KINDS: tuple[Kind, ...] = (*MessageKind, *SplitFedKind, *AllreduceKind)

HAND_SAMPLES: dict[Kind, Message] = {
    MessageKind.DISCOVER: Discover(run_id="run-1"),
    MessageKind.ANNOUNCE: Announce(
        device_id="w1", busy_with="", threads=2, slowdown=1.5, software="0.1", profile_hash="abc"
    ),
    MessageKind.STATUS: Status(device_id="w1", state="training", run_id="run-1", stage=2, detail="ok"),
    MessageKind.HEARTBEAT: Heartbeat(device_id="w1", seq=7, run_id="run-1", stage=1, interval=0.5),
    MessageKind.ASSIGN: Assign(
        run_id="run-1",
        plan_id=3,
        worker_list=["central", "w1", "w2"],
        points=[0, 2, 5, 9],
        model={"name": "cnn", "options": {"width": 8, "sizes": [1, 2, 3]}, "flag": True, "none": None},
        seed=42,
        committed_forward_id=10,
        committed_backward_id=9,
        status=1,
        options=TrainOptions(
            learning_rate=0.05,
            momentum=0.9,
            weight_decay=1e-4,
            staleness="none",
            aggregation_interval=2,
            lr_schedule="step",
            lr_steps=(60, 120),
            lr_gamma=0.5,
        ),
        epochs=2,
        batches_per_epoch=30,
        in_flight=3,
        weights={
            "0.weight": torch.randn(4, 3, generator=GEN),
            "0.bias": torch.zeros(4, dtype=torch.float64),
        },
    ),
    MessageKind.READY: Ready(run_id="run-1", plan_id=3, device_id="w1", stage=1, parameters=1234),
    AllreduceKind.ALLREDUCE: AllreduceMsg(
        run_id="run-1",
        step=7,
        attempt=1,
        kind="data_reduce",
        sender=2,
        origin=2,
        contributors=[2, 5, 6],
        data=torch.randn(10, generator=GEN),
        ts=12.5,
        echo=12.25,
        echo_delay=0.125,
        chunk=1,
        chunks=4,
    ),
    AllreduceKind.ALLREDUCE_STEP: AllreduceStep(
        run_id="run-1", step=7, attempt=1, members=["w1", "w2"], epoch=1, collect=True, weights=torch.ones(4)
    ),
    AllreduceKind.ALLREDUCE_DONE: AllreduceDone(
        run_id="run-1",
        device_id="w1",
        step=7,
        attempt=1,
        digest="abcd",
        loss=0.5,
        samples=100,
        contributors=[0, 1],
        collective_seconds=0.25,
    ),
    MessageKind.ACTIVATION: Activation(
        run_id="run-1",
        plan_id=3,
        stage=0,
        batch_id=17,
        version=4,
        mode="train",
        x=torch.randn(4, 8, 3, 3, generator=GEN),
        y=torch.tensor([1, 0, 3, 2]),
    ),
    MessageKind.GRADIENT: Gradient(
        run_id="run-1",
        plan_id=3,
        stage=1,
        batch_id=17,
        g=torch.randn(4, 8, 3, 3, generator=GEN).to(torch.float16),
        loss=0.75,
        correct=3,
        stage_times=[0.01, 0.02],
    ),
    MessageKind.EVAL_RESULT: EvalResult(
        run_id="run-1", plan_id=3, batch_id=2, correct=200, count=256, loss_sum=12.5
    ),
    MessageKind.COMMAND: SetCompression(run_id="run-1", plan_id=3, forward=[2, 32], backward=[32, 8]),
    MessageKind.WEIGHTS: Weights(
        run_id="run-1",
        device_id="w1",
        stage=1,
        start=2,
        end=5,
        version=8,
        tensors={"2.weight": _T, "3.mask": torch.tensor([True, False])},
        purpose="chain",
        optimizer={"2.weight.momentum": torch.ones(2, 3)},
    ),
    MessageKind.COMMIT: Commit(run_id="run-1", plan_id=4),
    MessageKind.METRICS: Metrics(
        device_id="w1", values={"compute": 0.5, "batches": 12, "name": "x"}, run_id="r"
    ),
    MessageKind.EVENT: Event(name="repartition", run_id="run-1", details={"points": [0, 3, 9]}),
    MessageKind.ERROR: ErrorReport(device_id="w1", code="assign", reason="plan 2 is stale", run_id="run-1"),
    MessageKind.PROBE: Probe(source="w1", target="w2", nonce=99, reply=True, padding=bytes(range(256)) * 4),
    MessageKind.LINK_REPORT: LinkReport(
        run_id="run-1", source="w1", target="w2", bandwidth=1.5e6, latency=0.004
    ),
    MessageKind.REPARTITION: Repartition(
        run_id="run-1",
        plan_id=5,
        points=[0, 3, 9],
        worker_list=["central", "w2"],
        previous_points=[0, 2, 5, 9],
        previous_workers=["central", "w1", "w2"],
        version=12,
        reason="w1 is slow",
    ),
    MessageKind.FETCH: FetchRequest(run_id="run-1", plan_id=5, requester="w2", owner="w1", layers=[3, 4]),
}


def _auto_value(tp: Any) -> Any:
    """A valid value for a field type, so that every message kind gets a sample without hand-written code."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _auto_value(next(a for a in typing.get_args(tp) if a is not type(None)))
    if origin is typing.Literal:
        return typing.get_args(tp)[-1]  # not the default (usually the first value)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_auto_value(item), _auto_value(item)]
    if origin is tuple:  # tuple[X, ...] (TrainOptions.lr_steps)
        return (_auto_value(typing.get_args(tp)[0]), 7)
    if origin is dict:
        key_t, val_t = typing.get_args(tp)
        return {_auto_value(key_t): _auto_value(val_t)}
    simple = {str: "text", int: 3, float: 1.25, bool: True, bytes: b"\x00\x01\xff"}
    if tp in simple:
        return simple[tp]
    if tp is torch.Tensor:
        return torch.arange(12, dtype=torch.float32).reshape(3, 4)
    if tp is Any:
        return {"nested": [1, "two", 3.0, None, True]}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):  # a record inside a message (TrainOptions)
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _auto_value(hints[f.name]) for f in dataclasses.fields(tp)})
    raise AssertionError(f"no automatic sample value for {tp}: add a hand-written sample")


# Fields whose valid values depend on each other, whatever the message: a batch's rows and total (two
# rows, as many as the automatic row losses), a stage's group and shares (primaries first: the automatic
# worker list is ["text", "text"]).
_AUTO_FIELDS: dict[str, Any] = {
    "rows": [1, 3],
    "total": 3,
    "groups": [["text", "helper"], ["text"]],
    "shares": [[0.75, 0.25], [1.0]],
    "members": ["text", "w2"],  # an allreduce step's members are distinct
    "share": 0.25,  # a share of a link (PaceReplicas): at most 1
}


def auto_sample(cls: type[Message]) -> Message:
    hints = typing.get_type_hints(cls)
    return cls(
        **{f.name: _AUTO_FIELDS.get(f.name, _auto_value(hints[f.name])) for f in dataclasses.fields(cls)}
    )


SAMPLES: dict[Kind, Message] = {
    kind: HAND_SAMPLES.get(kind) or auto_sample(cls) for kind, cls in MESSAGE_TYPES.items()
}


def assert_same_value(a: Any, b: Any, where: str = "value") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert_same_tensor(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            assert_same_value(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_value(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def assert_same_message(a: Message, b: Message) -> None:
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        assert_same_value(getattr(a, f.name), getattr(b, f.name), f"{type(a).__name__}.{f.name}")


def reencode(msg: Message, mutate: Any) -> bytes:
    """Encode ``msg`` properly, then let ``mutate(envelope)`` break it, keeping its JSON or CBOR encoding."""
    payload = encode(msg, sender="dev-1")
    if msg.ENCODING == "json":
        envelope = json.loads(payload)
        mutate(envelope)
        return json.dumps(envelope).encode()  # allow_nan: Python's json writes NaN, a sloppy peer might
    envelope = cbor2.loads(payload)
    mutate(envelope)
    return cbor2.dumps(envelope)


def put(path: tuple[str, ...], value: Any) -> Any:
    def mutate(env: dict[str, Any]) -> None:
        target = env
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def drop(path: tuple[str, ...]) -> Any:
    def mutate(env: dict[str, Any]) -> None:
        target = env
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate
