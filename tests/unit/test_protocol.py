"""Pure protocol tests (no broker): tensors, messages, topics, chunking, the memory transport, config
and the balanced partition."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import random
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cbor2
import numpy as np
import pytest
import torch
from cbor2 import CBORTag
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edgeagent.config import CentralConfig, DemoConfig, TrainConfig, build, load, load_yaml
from edgeagent.errors import ConfigError, ProtocolError
from edgeagent.planner.partition import balanced_partition, check_points, stage_of_layer
from edgeagent.protocol.allreduce_messages import AllreduceDone, AllreduceMsg, AllreduceStep
from edgeagent.protocol.chunking import CHUNK_TAG, Reassembler, is_chunk, split_payload
from edgeagent.protocol.commands import COMMAND_TYPES, Command, Reshare, SetCompression, Stop
from edgeagent.protocol.messages import (
    Activation,
    ActivationMode,
    Announce,
    Assign,
    Commit,
    Discover,
    ErrorCode,
    ErrorReport,
    EvalResult,
    Event,
    FetchRequest,
    Gradient,
    GradSync,
    Heartbeat,
    LinkReport,
    Message,
    MessageKind,
    Metrics,
    Probe,
    Ready,
    ReadyPhase,
    Repartition,
    Status,
    StatusState,
    Weights,
    WeightsPurpose,
)
from edgeagent.protocol.options import TrainOptions
from edgeagent.protocol.tensors import BOOL_TAG, MULTI_DIM_TAG, decode_tensor, encode_tensor
from edgeagent.protocol.topics import (
    ANY,
    DiscoveryInfo,
    DiscoveryTopics,
    Family,
    TopicFilters,
    TopicInfo,
    Topics,
    check_discovery_prefix,
    check_name,
    cluster_level,
    fill_wildcards,
    filter_wildcards,
    parse_topic,
    topic_matches,
)
from edgeagent.protocol.wire import FORMAT_VERSION, MESSAGE_TYPES, decode, encode
from edgeagent.transport.memory import MemoryBroker, MemoryTransport

REPO = Path(__file__).resolve().parents[2]

# =============================================================================================
# Tensors

SUPPORTED_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
]
NUMPY_DTYPE = {
    torch.bool: np.dtype(bool),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
}


def wire_round_trip(t: torch.Tensor) -> torch.Tensor:
    """Through real CBOR bytes, as on the network (cbor2 turns lists inside tags into tuples)."""
    return decode_tensor(cbor2.loads(cbor2.dumps(encode_tensor(t))))


def assert_same_tensor(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype
    assert tuple(a.shape) == tuple(b.shape)
    # Bitwise comparison: NaN payloads, -0.0 and infinities must survive unchanged.
    assert a.contiguous().numpy().tobytes() == b.contiguous().numpy().tobytes()


@settings(max_examples=150, deadline=None)
@given(
    data=st.sampled_from(SUPPORTED_DTYPES).flatmap(
        lambda dt: hnp.arrays(
            NUMPY_DTYPE[dt],
            hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
        ).map(lambda arr: (dt, arr))
    )
)
def test_tensor_round_trip_hypothesis(data: tuple[torch.dtype, np.ndarray]) -> None:
    dtype, arr = data
    t = torch.from_numpy(arr.copy())
    assert t.dtype == dtype
    out = wire_round_trip(t)
    assert_same_tensor(t, out)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (2, 3), (2, 1, 4)], ids=str)
def test_tensor_round_trip_every_dtype(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        t = torch.randint(0, 2, shape, generator=gen).to(torch.bool)
    elif dtype.is_floating_point:
        t = (torch.randn(shape, generator=gen, dtype=torch.float64) * 100).to(dtype)
    else:
        info = torch.iinfo(dtype)
        t = torch.randint(max(info.min, -(2**62)), min(info.max, 2**62), shape, generator=gen, dtype=dtype)
    out = wire_round_trip(t)
    assert_same_tensor(t, out)
    if dtype == torch.bool:
        assert isinstance(encode_tensor(t), CBORTag) and encode_tensor(t).tag == BOOL_TAG
    assert t.dim() != 0 or out.dim() == 0  # a 0-d tensor stays 0-d, not shape (1,)


def test_tensor_extremes_and_layout() -> None:
    # Integer extremes, float specials, a non-contiguous view and a tensor that requires grad.
    ints = torch.tensor([torch.iinfo(torch.int64).min, -1, 0, torch.iinfo(torch.int64).max])
    assert_same_tensor(ints, wire_round_trip(ints))
    floats = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 1e-45], dtype=torch.float32)
    assert_same_tensor(floats, wire_round_trip(floats))
    view = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    assert not view.is_contiguous()
    assert torch.equal(wire_round_trip(view), view)
    leaf = torch.ones(2, 2, requires_grad=True)
    out = wire_round_trip(leaf)
    assert torch.equal(out, leaf.detach()) and not out.requires_grad
    # The decoded tensor owns writable memory (no read-only numpy buffer underneath).
    out += 1
    assert torch.equal(out, torch.full((2, 2), 2.0))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.bfloat16, torch.uint16], ids=str)
def test_encode_rejects_unsupported_dtype(dtype: torch.dtype) -> None:
    with pytest.raises(ProtocolError, match="dtype"):
        encode_tensor(torch.zeros(2, dtype=dtype))


def _tensor_item(shape: Any, tag: int, raw: Any) -> CBORTag:
    return CBORTag(MULTI_DIM_TAG, [shape, CBORTag(tag, raw)])


@pytest.mark.parametrize(
    "item",
    [
        pytest.param(_tensor_item([2, 2], 85, b"\x00" * 15), id="one-byte-short"),
        pytest.param(_tensor_item([2, 2], 85, b"\x00" * 17), id="one-byte-long"),
        pytest.param(_tensor_item([], 79, b"\x00" * 4), id="0d-int64-needs-8"),
        pytest.param(_tensor_item([0], 85, b"\x00"), id="empty-with-bytes"),
        pytest.param(_tensor_item([2**31], 64, b""), id="over-element-limit"),
    ],
)
def test_decode_tensor_rejects_wrong_byte_count(item: CBORTag) -> None:
    with pytest.raises(ProtocolError):
        decode_tensor(item)


@pytest.mark.parametrize(
    "shape",
    [[-1], [2, -3], ["2"], [1.0], None, 3, "23", {"a": 1}],
    ids=lambda s: repr(s),
)
def test_decode_tensor_rejects_bad_shape(shape: Any) -> None:
    with pytest.raises(ProtocolError, match="shape"):
        decode_tensor(_tensor_item(shape, 85, b"\x00" * 4))


@pytest.mark.parametrize(
    "typed",
    [
        pytest.param(CBORTag(81, b"\x00" * 4), id="float32-big-endian"),
        pytest.param(CBORTag(69, b"\x00" * 4), id="uint16-le"),
        pytest.param(CBORTag(87, b"\x00" * 16), id="float128-le"),
        pytest.param(CBORTag(12345, b"\x00" * 4), id="private-tag"),
        pytest.param(CBORTag(85, [0, 0, 0, 0]), id="list-instead-of-bytes"),
        pytest.param(CBORTag(85, "abcd"), id="text-instead-of-bytes"),
        pytest.param(b"\x00" * 4, id="untagged-bytes"),
    ],
)
def test_decode_tensor_rejects_unknown_typed_array(typed: Any) -> None:
    with pytest.raises(ProtocolError, match="typed array"):
        decode_tensor(CBORTag(MULTI_DIM_TAG, [[1], typed]))


@pytest.mark.parametrize(
    "item",
    [
        42,
        "tensor",
        None,
        b"\x00\x00\x00\x00",
        [[1], CBORTag(85, b"\x00" * 4)],
        CBORTag(41, [[1], CBORTag(85, b"\x00" * 4)]),
        CBORTag(MULTI_DIM_TAG, [[1]]),
        CBORTag(MULTI_DIM_TAG, [[1], CBORTag(85, b"\x00" * 4), 0]),
        CBORTag(MULTI_DIM_TAG, "not an array"),
        CBORTag(BOOL_TAG, 1),
        CBORTag(BOOL_TAG, CBORTag(BOOL_TAG, CBORTag(MULTI_DIM_TAG, [[1], CBORTag(64, b"\x01")]))),
    ],
    ids=repr,
)
def test_decode_tensor_rejects_non_tensors(item: Any) -> None:
    with pytest.raises(ProtocolError):
        decode_tensor(item)


@pytest.mark.parametrize(
    "shape",
    [[2**32, 2**32], [2**32, 2**32, 1], [0, 2**62, 2**62], [2**62, 2**62, 0], [2**70], [2**31, 0]],
    ids=str,
)
def test_decode_tensor_rejects_overflowing_shape(shape: list[int]) -> None:
    # A product that wraps around in 64 bits (or a zero-element tensor with absurd dimensions) must be
    # refused as a protocol error, not crash numpy.
    with pytest.raises(ProtocolError):
        decode_tensor(_tensor_item(shape, 85, b""))


# =============================================================================================
# Messages

_GEN = torch.Generator().manual_seed(0)
_T = torch.arange(6, dtype=torch.float32).reshape(2, 3)

# Hand-written, realistic instances. Kinds added to the protocol later get an automatic sample (below).
HAND_SAMPLES: dict[MessageKind, Message] = {
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
            learning_rate=0.05, momentum=0.9, weight_decay=1e-4, staleness="none", aggregation_interval=2
        ),
        epochs=2,
        batches_per_epoch=30,
        in_flight=3,
        weights={
            "0.weight": torch.randn(4, 3, generator=_GEN),
            "0.bias": torch.zeros(4, dtype=torch.float64),
        },
    ),
    MessageKind.READY: Ready(run_id="run-1", plan_id=3, device_id="w1", stage=1, parameters=1234),
    MessageKind.ALLREDUCE: AllreduceMsg(
        run_id="run-1",
        step=7,
        attempt=1,
        kind="data_reduce",
        sender=2,
        origin=2,
        contributors=[2, 5, 6],
        data=torch.randn(10, generator=_GEN),
        ts=12.5,
        echo=12.25,
        echo_delay=0.125,
    ),
    MessageKind.ALLREDUCE_STEP: AllreduceStep(
        run_id="run-1", step=7, attempt=1, members=["w1", "w2"], epoch=1, collect=True, weights=torch.ones(4)
    ),
    MessageKind.ALLREDUCE_DONE: AllreduceDone(
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
        x=torch.randn(4, 8, 3, 3, generator=_GEN),
        y=torch.tensor([1, 0, 3, 2]),
    ),
    MessageKind.GRADIENT: Gradient(
        run_id="run-1",
        plan_id=3,
        stage=1,
        batch_id=17,
        g=torch.randn(4, 8, 3, 3, generator=_GEN).to(torch.float16),
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
}


def auto_sample(cls: type[Message]) -> Message:
    hints = typing.get_type_hints(cls)
    return cls(
        **{f.name: _AUTO_FIELDS.get(f.name, _auto_value(hints[f.name])) for f in dataclasses.fields(cls)}
    )


SAMPLES: dict[MessageKind, Message] = {
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


def test_every_message_kind_has_a_class_and_samples() -> None:
    assert set(MESSAGE_TYPES) == set(MessageKind)
    for kind, cls in MESSAGE_TYPES.items():
        assert cls.KIND is kind and cls.ENCODING in ("json", "cbor")
    for kind, msg in HAND_SAMPLES.items():
        assert isinstance(msg, MESSAGE_TYPES[kind])


@pytest.mark.parametrize("kind", list(MessageKind), ids=lambda k: k.value)
def test_message_round_trip_auto_sample(kind: MessageKind) -> None:
    # A command is one of its subclasses (the base has no name): every one of them round-trips.
    classes = list(COMMAND_TYPES.values()) if kind is MessageKind.COMMAND else [MESSAGE_TYPES[kind]]
    for cls in classes:
        msg = auto_sample(cls)
        sender, out = decode(encode(msg, sender="auto"))
        assert sender == "auto"
        assert type(out) is cls
        assert_same_message(msg, out)


@pytest.mark.parametrize("kind", list(MessageKind), ids=lambda k: k.value)
def test_message_round_trip(kind: MessageKind) -> None:
    msg = SAMPLES[kind]
    payload = encode(msg, sender="dev-1")
    sender, out = decode(payload)
    assert sender == "dev-1"
    assert_same_message(msg, out)
    assert not is_chunk(payload)


@pytest.mark.parametrize("kind", list(MessageKind), ids=lambda k: k.value)
def test_message_encoding_is_json_or_cbor(kind: MessageKind) -> None:
    msg = SAMPLES[kind]
    payload = encode(msg, sender="dev-1")
    if msg.ENCODING == "json":
        assert payload.startswith(b"{")
        envelope = json.loads(payload)
        assert envelope["v"] == FORMAT_VERSION and envelope["k"] == kind.value and envelope["s"] == "dev-1"
        fields = {f.name for f in dataclasses.fields(msg)}
        if isinstance(msg, Command):  # commands keep {run_id, name, args} on the wire
            assert envelope["b"]["name"] == msg.NAME and set(envelope["b"]["args"]) == fields - {"run_id"}
            fields = {"run_id", "name", "args"}
        assert set(envelope["b"]) == fields
    else:
        assert msg.ENCODING == "cbor"
        assert not payload.startswith(b"{")
        with pytest.raises(ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            json.loads(payload)
        envelope = cbor2.loads(payload)
        assert envelope["v"] == FORMAT_VERSION and envelope["k"] == kind.value


def test_message_defaults_round_trip() -> None:
    # Fields left at their defaults are sent and come back as defaults.
    _, out = decode(encode(Heartbeat(device_id="w", seq=1), sender="w"))
    assert out == Heartbeat(device_id="w", seq=1, run_id="", stage=-1, interval=1.0)
    # A body that omits defaulted fields (a hand-written command) decodes with the defaults.
    raw = json.dumps({"v": 1, "k": "command", "s": "user", "b": {"run_id": "r", "name": "stop"}}).encode()
    assert decode(raw) == ("user", Stop(run_id="r"))


def _reencode(msg: Message, mutate: Any) -> bytes:
    """Encode ``msg`` properly, then let ``mutate(envelope)`` break it, keeping its JSON or CBOR encoding."""
    payload = encode(msg, sender="dev-1")
    if msg.ENCODING == "json":
        envelope = json.loads(payload)
        mutate(envelope)
        return json.dumps(envelope).encode()  # allow_nan: Python's json writes NaN, a sloppy peer might
    envelope = cbor2.loads(payload)
    mutate(envelope)
    return cbor2.dumps(envelope)


def _set(path: tuple[str, ...], value: Any) -> Any:
    def mutate(env: dict[str, Any]) -> None:
        target = env
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path: tuple[str, ...]) -> Any:
    def mutate(env: dict[str, Any]) -> None:
        target = env
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


BAD_ENVELOPES = [
    # (id, message, mutation, regex the error must match)
    ("version-missing", MessageKind.COMMIT, _delete(("v",)), r"version None"),
    ("version-0-json", MessageKind.HEARTBEAT, _set(("v",), 0), r"version 0\b.*\b1\b"),
    ("version-string", MessageKind.COMMIT, _set(("v",), "1"), r"version '1'"),
    ("unknown-kind", MessageKind.COMMIT, _set(("k",), "teleport"), r"unknown message kind 'teleport'"),
    ("kind-missing", MessageKind.STATUS, _delete(("k",)), r"unknown message kind"),
    ("sender-not-str", MessageKind.STATUS, _set(("s",), 5), r"sender"),
    ("body-not-map", MessageKind.COMMIT, _set(("b",), [1, 2]), r"body"),
    ("unknown-field-json", MessageKind.STATUS, _set(("b", "colour"), "red"), r"unknown fields \['colour'\]"),
    ("unknown-field-cbor", MessageKind.ACTIVATION, _set(("b", "z"), 1), r"unknown fields \['z'\]"),
    ("missing-field-json", MessageKind.HEARTBEAT, _delete(("b", "seq")), r"lacks field 'seq'"),
    ("missing-field-cbor", MessageKind.ACTIVATION, _delete(("b", "x")), r"lacks field 'x'"),
    ("batch-id-as-string", MessageKind.ACTIVATION, _set(("b", "batch_id"), "17"), r"activation\.batch_id"),
    ("bool-for-int", MessageKind.HEARTBEAT, _set(("b", "seq"), True), r"heartbeat\.seq.*bool"),
    ("float-for-int", MessageKind.READY, _set(("b", "stage"), 1.0), r"ready\.stage"),
    ("nan-for-float-cbor", MessageKind.GRADIENT, _set(("b", "loss"), math.nan), r"gradient\.loss.*finite"),
    ("nan-for-float-json", MessageKind.HEARTBEAT, _set(("b", "interval"), math.nan), r"interval.*finite"),
    ("inf-for-float", MessageKind.EVAL_RESULT, _set(("b", "loss_sum"), math.inf), r"loss_sum.*finite"),
    ("bool-for-float", MessageKind.ASSIGN, _set(("b", "learning_rate"), True), r"learning_rate"),
    ("str-for-float", MessageKind.ANNOUNCE, _set(("b", "slowdown"), "fast"), r"announce\.slowdown"),
    ("int-for-str", MessageKind.STATUS, _set(("b", "state"), 3), r"status\.state"),
    ("null-for-str", MessageKind.DISCOVER, _set(("b", "run_id"), None), r"discover\.run_id"),
    ("list-item-type", MessageKind.ASSIGN, _set(("b", "points"), [0, "2", 9]), r"assign\.points\[1\]"),
    ("list-not-list", MessageKind.ASSIGN, _set(("b", "worker_list"), "w1"), r"worker_list"),
    ("dict-not-dict", MessageKind.COMMAND, _set(("b", "args"), [1]), r"command\.args"),
    ("tensor-as-list", MessageKind.ACTIVATION, _set(("b", "x"), [[1.0, 2.0]]), r"tensor"),
    ("tensor-dict-value", MessageKind.WEIGHTS, _set(("b", "tensors"), {"w": 1}), r"tensor"),
    ("optional-tensors", MessageKind.ASSIGN, _set(("b", "weights"), {"w": "x"}), r"assign\.weights"),
    ("stage-times-str", MessageKind.GRADIENT, _set(("b", "stage_times"), ["x"]), r"stage_times\[0\]"),
    # Fields with a fixed set of values: the error names the field, the value and the allowed values.
    ("state-unknown", MessageKind.STATUS, _set(("b", "state"), "up"), r"status\.state: 'up' is not one of"),
    ("state-case", MessageKind.STATUS, _set(("b", "state"), "Idle"), r"'Idle' is not one of 'online', 'idl"),
    ("mode-unknown", MessageKind.ACTIVATION, _set(("b", "mode"), "t"), r"activation\.mode.*'train', 'eval'"),
    ("phase-unknown", MessageKind.READY, _set(("b", "phase"), "done"), r"ready\.phase: 'done'.*'alive'"),
    ("purpose-unknown", MessageKind.WEIGHTS, _set(("b", "purpose"), "x"), r"weights\.purpose.*'global'"),
    ("code-unknown", MessageKind.ERROR, _set(("b", "code"), "oops"), r"error\.code: 'oops'.*'assign'"),
    ("assign-mode", MessageKind.ASSIGN, _set(("b", "mode"), 3), r"assign\.mode: expected str"),
    (
        "assign-options",
        MessageKind.ASSIGN,
        _set(("b", "options", "learning_rate"), "fast"),
        r"assign\.options\.learning_rate: expected a number",
    ),
    (
        "assign-options-map",
        MessageKind.ASSIGN,
        _set(("b", "options"), [0.1]),
        r"assign\.options: expected a map",
    ),
    ("literal-not-str", MessageKind.WEIGHTS, _set(("b", "purpose"), 1), r"weights\.purpose: 1 is not one"),
    ("literal-list", MessageKind.READY, _set(("b", "phase"), ["built"]), r"ready\.phase: .*, got list"),
    ("literal-long", MessageKind.STATUS, _set(("b", "state"), "x" * 1000), r"'x{35}\.\.\.' is not one of"),
]


@pytest.mark.parametrize(
    ("kind", "mutate", "pattern"), [b[1:] for b in BAD_ENVELOPES], ids=[b[0] for b in BAD_ENVELOPES]
)
def test_decode_rejects_bad_envelopes(kind: MessageKind, mutate: Any, pattern: str) -> None:
    payload = _reencode(SAMPLES[kind], mutate)
    with pytest.raises(ProtocolError, match=pattern):
        decode(payload)


ENUMERATIONS = {
    (Status, "state"): StatusState,
    (Activation, "mode"): ActivationMode,
    (Ready, "phase"): ReadyPhase,
    (Weights, "purpose"): WeightsPurpose,
    (ErrorReport, "code"): ErrorCode,
}


@pytest.mark.parametrize(("cls", "name"), list(ENUMERATIONS), ids=lambda v: getattr(v, "__name__", v))
def test_enumerated_fields_take_exactly_their_values(cls: type[Message], name: str) -> None:
    alias = ENUMERATIONS[(cls, name)]
    assert typing.get_type_hints(cls)[name] is alias
    kind = cls.KIND
    for value in typing.get_args(alias):
        _, out = decode(_reencode(SAMPLES[kind], _set(("b", name), value)))
        assert getattr(out, name) == value
    with pytest.raises(ProtocolError, match=rf"{kind.value}\.{name}: 'other' is not one of"):
        decode(_reencode(SAMPLES[kind], _set(("b", name), "other")))
    # Observers (the monitor) may take a value newer than their code; still only a string.
    _, out = decode(_reencode(SAMPLES[kind], _set(("b", name), "other")), open_values=True)
    assert getattr(out, name) == "other"
    with pytest.raises(ProtocolError, match=rf"{kind.value}\.{name}"):
        decode(_reencode(SAMPLES[kind], _set(("b", name), 7)), open_values=True)


def test_enumerations_are_tested_and_documented() -> None:
    for cls in [*MESSAGE_TYPES.values(), *COMMAND_TYPES.values()]:
        for name, tp in typing.get_type_hints(cls).items():
            if typing.get_origin(tp) is typing.Literal:
                assert (cls, name) in ENUMERATIONS, f"{cls.__name__}.{name} is enumerated: test it"
    doc = (REPO / "docs" / "protocol.md").read_text(encoding="utf-8")
    for alias in ENUMERATIONS.values():
        for value in typing.get_args(alias):
            assert f"`{value}`" in doc, f"docs/protocol.md does not list {value!r}"


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
        x=torch.randn(3, 8, generator=_GEN),
        y=torch.tensor([1, 0, 3]),
        rows=[5, 8],
        total=8,
    ),
    "gradient": Gradient(
        run_id="run-1",
        plan_id=3,
        stage=1,
        batch_id=17,
        g=torch.randn(3, 8, generator=_GEN),
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
        grads={"2.weight": torch.randn(4, 3, generator=_GEN), "2.bias": torch.zeros(4)},
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
        _set(("b", "rows"), [3, 2]),
        r"activation of batch 17: rows \[3, 2\] must",
    ),
    ("rows-empty-span", "activation", _set(("b", "rows"), [4, 4]), r"rows \[4, 4\] must be \[lo, hi\]"),
    ("rows-beyond-total", "activation", _set(("b", "rows"), [5, 9]), r"rows \[5, 9\].*<= total 8"),
    ("rows-negative", "activation", _set(("b", "rows"), [-1, 3]), r"rows \[-1, 3\].*0 <= lo"),
    ("rows-one-number", "activation", _set(("b", "rows"), [3]), r"rows \[3\] must be \[lo, hi\]"),
    ("rows-not-ints", "activation", _set(("b", "rows"), [0, "3"]), r"activation\.rows\[1\]: expected int"),
    ("gradient-rows", "gradient", _set(("b", "total"), 7), r"gradient of batch 17: rows \[5, 8\].*total 7"),
    (
        "row-loss-short",
        "gradient",
        _set(("b", "row_loss"), [0.5, 0.25]),
        r"gradient of batch 17: 2 row losses and 3 row results for 3 rows",
    ),
    (
        "row-correct-long",
        "gradient",
        _set(("b", "row_correct"), [1, 1, 0, 1]),
        r"3 row losses and 4 row results for 3 rows",
    ),
    (
        "eval-rows",
        "eval_result",
        _set(("b", "rows"), [6, 12]),
        r"evaluation result of batch 2: rows \[6, 12\]",
    ),
    ("sync-no-rows", "grad_sync", _set(("b", "rows"), []), r"gradient sync of batch 17 names no rows"),
    ("sync-rows", "grad_sync", _set(("b", "rows"), [8, 5]), r"gradient sync of batch 17: rows \[8, 5\]"),
    (
        "group-not-primary-first",
        "assign",
        _set(("b", "groups"), [["central"], ["w3", "w1"], ["w2"]]),
        r"stage 1: group \['w3', 'w1'\].*must start with its primary 'w1'",
    ),
    (
        "group-twice",
        "assign",
        _set(("b", "groups"), [["central"], ["w1", "w1"], ["w2"]]),
        r"stage 1: .*name each device once",
    ),
    (
        "group-empty",
        "assign",
        _set(("b", "groups"), [["central"], [], ["w2"]]),
        r"stage 1: group \[\]",
    ),
    (
        "shares-sum",
        "assign",
        _set(("b", "shares"), [[1.0], [0.5, 0.25], [1.0]]),
        r"stage 1: shares \[0\.5, 0\.25\] must be in \(0, 1\] and sum to 1",
    ),
    (
        "share-zero",
        "assign",
        _set(("b", "shares"), [[1.0], [1.0, 0.0], [1.0]]),
        r"stage 1: shares \[1\.0, 0\.0\] must be in \(0, 1\]",
    ),
    (
        "share-per-member",
        "assign",
        _set(("b", "shares"), [[1.0], [1.0], [1.0]]),
        r"stage 1: .*give each a share",
    ),
    (
        "groups-per-stage",
        "assign",
        _set(("b", "groups"), [["central"]]),
        r"1 groups and 3 share lists for 3 stages",
    ),
    ("shares-without-groups", "assign", _delete(("b", "groups")), r"0 groups and 3 share lists for 3 stages"),
    (
        "repartition-primary",
        "repartition",
        _set(("b", "groups"), [["central"], ["w1", "w2"]]),
        r"stage 1: group \['w1', 'w2'\].*primary 'w2'",
    ),
    (
        "reshare-primary",
        "reshare",
        _set(("b", "args", "groups"), [["central"], ["w2"], ["w1"]]),
        r"stage 1: group \['w2'\].*primary 'w1'",
    ),
    (
        "reshare-shares",
        "reshare",
        _set(("b", "args", "shares"), [[1.0], [0.9], [1.0]]),
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
        decode(_reencode(HYBRID_SAMPLES[name], mutate))


@pytest.mark.parametrize("kind", [MessageKind.HEARTBEAT, MessageKind.ACTIVATION], ids=lambda k: k.value)
def test_decode_rejects_wrong_version_naming_both(kind: MessageKind) -> None:
    payload = _reencode(SAMPLES[kind], _set(("v",), FORMAT_VERSION + 1))
    with pytest.raises(ProtocolError) as info:
        decode(payload)
    text = str(info.value)
    assert re.search(rf"\b{FORMAT_VERSION + 1}\b", text) and re.search(rf"\b{FORMAT_VERSION}\b", text), text


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\xff\xfe\x00garbage\x01", id="garbage"),
        pytest.param(b"{not json", id="broken-json"),
        pytest.param(b"{}", id="empty-json-object"),
        pytest.param(b"\x00", id="cbor-int"),
        pytest.param(cbor2.dumps([1, "heartbeat", "s", {}]), id="cbor-array-envelope"),
        pytest.param(b'"just a string"', id="json-string"),
        pytest.param(b"\xa1", id="truncated-cbor-map"),
        pytest.param(b"\x9f\x9f\x9f", id="truncated-indefinite-cbor"),
        pytest.param(bytes(range(256)), id="all-bytes"),
    ],
)
def test_decode_rejects_undecodable_payloads(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(payload)


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=200))
def test_decode_garbage_raises_only_protocol_error(payload: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode(payload)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(
            b'{"v":1,"k":"heartbeat","s":"w","b":{"device_id":"w","seq":1,"interval":1' + b"0" * 400 + b"}}",
            id="huge-int-for-float",
        ),
        pytest.param(
            cbor2.dumps({"v": 1, "k": "commit", "s": "c", "b": {"run_id": "r", "plan_id": 1, 5: 0, b"k": 0}}),
            id="non-string-body-keys",
        ),
        pytest.param(
            b'{"v":true,"k":"commit","s":"c","b":{"run_id":"r","plan_id":1}}',
            id="version-true",
        ),
    ],
)
def test_decode_edge_cases_raise_protocol_error(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(payload)


# =============================================================================================
# Topics

T = Topics("clu-1")


def _link(family: Family) -> str:
    if family is not Family.LINK:
        raise ValueError(f"{family} is not a link")
    return T.link("w1", "w2")


def _builders(family: Family) -> list[str]:
    """Which of fixed / device / stage accept ``family`` (exactly one should)."""
    out = []
    for name, build_one in (
        ("fixed", lambda: T.fixed(family)),
        ("device", lambda: T.device(family, "w1")),
        ("stage", lambda: T.stage(family, 0, "w1")),
        ("link", lambda: _link(family)),
    ):
        try:
            build_one()
        except ValueError:
            continue
        out.append(name)
    return out


def _all_built_topics() -> list[tuple[str, TopicInfo]]:
    out: list[tuple[str, TopicInfo]] = []
    for family in Family:
        kinds = _builders(family)
        if kinds == ["fixed"]:
            out.append((T.fixed(family), TopicInfo(family)))
        elif kinds == ["device"]:
            for dev in ("w1", "Central_0.a-b", "x" * 64):
                out.append((T.device(family, dev), TopicInfo(family, device=dev)))
        elif kinds == ["stage"]:
            for stage, dev in ((0, "central"), (1, "w1"), (12, "x" * 64)):
                out.append((T.stage(family, stage, dev), TopicInfo(family, device=dev, stage=stage)))
        elif kinds == ["link"]:
            for a, b in (("w1", "w2"), ("central", "x" * 64)):
                out.append((T.link(a, b), TopicInfo(family, device=a, peer=b)))
    for stage in (0, 3):
        out.append((T.activations(stage, "w1"), TopicInfo(Family.ACTIVATIONS, device="w1", stage=stage)))
        out.append((T.gradients(stage, "w1"), TopicInfo(Family.GRADIENTS, device="w1", stage=stage)))
        out.append((T.results(stage, "w1"), TopicInfo(Family.RESULTS, device="w1", stage=stage)))
    return out


@pytest.mark.parametrize("family", list(Family), ids=lambda f: f.name)
def test_every_family_has_exactly_one_builder(family: Family) -> None:
    assert len(_builders(family)) == 1, _builders(family)


def test_topic_builders_cover_every_family() -> None:
    assert {info.family for _, info in _all_built_topics()} == set(Family)


@pytest.mark.parametrize(("topic", "info"), _all_built_topics(), ids=lambda v: str(v))
def test_topic_parse_inverts_builders(topic: str, info: TopicInfo) -> None:
    assert topic.startswith("edgeagent/v1/clu-1/")
    assert T.parse(topic) == info
    assert topic_matches(T.all(), topic)
    assert not any(ch in topic for ch in "+#")
    assert not topic_matches(Topics("other").all(), topic)


def test_topic_device_wildcards() -> None:
    pattern = T.devices(Family.HEARTBEAT)
    assert topic_matches(pattern, T.device(Family.HEARTBEAT, "w1"))
    assert topic_matches(pattern, T.device(Family.HEARTBEAT, "w2"))
    assert not topic_matches(pattern, T.device(Family.STATUS, "w1"))
    assert not topic_matches(pattern, T.activations(0, "w1"))
    stage_inputs = T.stage_filter(Family.ACTIVATIONS, 1)  # every producer of stage 1's activations
    assert topic_matches(stage_inputs, T.activations(1, "w1")) and topic_matches(
        stage_inputs, T.activations(1, "w2")
    )
    assert not topic_matches(stage_inputs, T.activations(2, "w1"))
    assert not topic_matches(stage_inputs, T.gradients(1, "w1"))


@pytest.mark.parametrize(("topic", "info"), _all_built_topics(), ids=lambda v: str(v))
def test_parse_topic_of_any_cluster(topic: str, info: TopicInfo) -> None:
    assert cluster_level(topic) == "clu-1"
    assert parse_topic(topic) == ("clu-1", info)
    assert parse_topic(topic.replace("/clu-1/", "/other/", 1)) == ("other", info)


@pytest.mark.parametrize(
    "topic", ["edgeagent/v1/clu-1", "edgeagent/v2/clu-1/run/commit", "x/v1/clu-1/run/commit", "", "edgeagent"]
)
def test_cluster_level_needs_the_root_and_a_level_after_the_cluster(topic: str) -> None:
    assert cluster_level(topic) is None
    with pytest.raises(ProtocolError, match="not under edgeagent/v1/<cluster>/"):
        parse_topic(topic)


def test_cluster_level_of_filters_and_bad_names() -> None:
    assert cluster_level("edgeagent/v1/+/device/+/status") == "+"
    assert cluster_level("edgeagent/v1/#/x") == "#"
    assert cluster_level("edgeagent/v1/clu-1/") == "clu-1"
    for bad in ("edgeagent/v1/+/run/commit", "edgeagent/v1/a b/run/commit", "edgeagent/v1/clu-1/run/nope"):
        with pytest.raises(ProtocolError):
            parse_topic(bad)


@pytest.mark.parametrize("cluster", ["clu-1", ANY])
def test_topic_filters_match_the_topics_they_name(cluster: str) -> None:
    tree = TopicFilters(cluster)
    assert TopicFilters() == TopicFilters(ANY)
    for other in (T, Topics("other")):
        matches = other.cluster == "clu-1" or cluster == ANY
        for topic, info in _all_built_topics():
            topic = topic.replace("/clu-1/", f"/{other.cluster}/", 1)
            assert topic_matches(tree.all(), topic) is matches
            if info.family is Family.LINK:
                assert info.device is not None and info.peer is not None
                assert topic_matches(tree.link(), topic) is matches
                assert topic_matches(tree.link(info.device, info.peer), topic) is matches
                assert not topic_matches(tree.link(info.peer, "someone-else"), topic)
            elif info.stage is not None:
                assert info.device is not None  # a stage output names the device that computed it
                assert topic_matches(tree.stage(info.family), topic) is matches
                assert topic_matches(tree.stage(info.family, info.device), topic) is matches
                assert not topic_matches(tree.stage(info.family, "someone-else"), topic)
            elif info.device is not None:
                assert topic_matches(tree.device(info.family), topic) is matches
                assert topic_matches(tree.device(info.family, info.device), topic) is matches
                assert not topic_matches(tree.device(info.family, "someone-else"), topic)
            else:
                assert topic_matches(tree.fixed(info.family), topic) is matches
    assert TopicFilters("clu-1").all() == T.all()
    assert TopicFilters("clu-1").device(Family.HEARTBEAT) == T.devices(Family.HEARTBEAT)
    with pytest.raises(ValueError):
        tree.device(Family.ACTIVATIONS)
    with pytest.raises(ValueError):
        tree.stage(Family.STATUS)
    with pytest.raises(ValueError):
        tree.fixed(Family.STATUS)


def test_filter_wildcards_and_filling_them() -> None:
    assert filter_wildcards("a/b") == (0, False)
    assert filter_wildcards("a/+/b/+") == (2, False)
    assert filter_wildcards("+/#") == (1, True)
    assert filter_wildcards("a/b#") == (0, False)  # not a wildcard level
    assert fill_wildcards("a/+/b/+", ["x", "y"]) == "a/x/b/y"
    assert fill_wildcards("a/b", []) == "a/b"
    with pytest.raises(ValueError):
        fill_wildcards("a/+/b/+", ["x"])


def test_discovery_topics() -> None:
    ha = DiscoveryTopics()
    assert ha.prefix == "homeassistant"
    assert ha.config("sensor", "node", "obj") == "homeassistant/sensor/node/obj/config"
    assert ha.configs("node") == "homeassistant/+/node/+/config"
    assert ha.configs() == "homeassistant/+/+/+/config"
    assert (ha.status(), ha.all()) == ("homeassistant/status", "homeassistant/#")
    assert ha.parse(ha.config("sensor", "node", "obj")) == DiscoveryInfo("config", node="node")
    assert ha.parse("homeassistant/status") == DiscoveryInfo("status")
    for other in ("homeassistant/#", ha.configs("node"), "homeassistant/status/x", "homeassistant/a/b/c/d"):
        assert ha.parse(other) == DiscoveryInfo("other")
    for outside in ("homeassistant", "homeassistantx/status", "edgeagent/v1/lab/run/commit", ""):
        assert ha.parse(outside) is None
    site = DiscoveryTopics("site/ha")
    assert site.parse("site/ha/sensor/n/o/config") == DiscoveryInfo("config", node="n")
    assert site.parse("homeassistant/sensor/n/o/config") is None


def test_check_discovery_prefix() -> None:
    assert check_discovery_prefix("site/ha") == "site/ha"
    for bad in ("", "#", "ha/+", "ha//x", "a/b/c/d/e", "edgeagent/x"):
        with pytest.raises(ValueError, match="discovery prefix"):
            check_discovery_prefix(bad)


@pytest.mark.parametrize("bad", ["a/b", "+", "#", "", "x" * 65, "a b", "w+1", "dev#", "ü", "a\tb"])
def test_invalid_device_ids_rejected(bad: str) -> None:
    with pytest.raises(ProtocolError, match="device id"):
        T.device(Family.STATUS, bad)
    with pytest.raises(ProtocolError):
        check_name("device id", bad)
    with pytest.raises(ProtocolError):
        Topics(bad)


def test_topic_builder_misuse() -> None:
    with pytest.raises(ValueError):
        T.device(Family.ACTIVATIONS, "w1")
    with pytest.raises(ValueError):
        T.stage(Family.STATUS, 0, "w1")
    with pytest.raises(ValueError):
        T.stage(Family.ACTIVATIONS, -1, "w1")
    with pytest.raises(ProtocolError):
        T.stage(Family.ACTIVATIONS, 0, "+")  # a wildcard is a filter (stage_filter), not a device
    with pytest.raises(ValueError):
        T.fixed(Family.ANNOUNCE)  # a device's own topic: device/<id>/announce
    with pytest.raises(ValueError):
        T.fixed(Family.STATUS)


@pytest.mark.parametrize(
    "topic",
    [
        "edgeagent/v1/other/run/commit",
        "edgeagent/v2/clu-1/run/commit",
        "edgeagent/v1/clu-1",
        "edgeagent/v1/clu-1/",
        "edgeagent/v1/clu-10/run/commit",
        "other/v1/clu-1/run/commit",
        "edgeagent/v1/clu-1/run",
        "edgeagent/v1/clu-1/run/commit/extra",
        "edgeagent/v1/clu-1/device/w1/teleport",
        "edgeagent/v1/clu-1/device/w1",
        "edgeagent/v1/clu-1/device/a/b/status",
        "edgeagent/v1/clu-1/device/+/status",
        "edgeagent/v1/clu-1/device//status",
        "edgeagent/v1/clu-1/stage/x/act",
        "edgeagent/v1/clu-1/stage/-1/act",
        "edgeagent/v1/clu-1/stage//act",
        "edgeagent/v1/clu-1/stage/1/status",
        "edgeagent/v1/clu-1/device/w1/act",
        "edgeagent/v1/clu-1/status",
        "edgeagent/v1/clu-1/#",
        "",
    ],
)
def test_topic_parse_rejects_foreign_topics(topic: str) -> None:
    with pytest.raises(ProtocolError):
        T.parse(topic)


@pytest.mark.parametrize(
    "topic",
    [
        pytest.param(
            "edgeagent/v1/clu-1/stage/\u00b2/act",
            id="superscript-stage",
        ),
        pytest.param(
            "edgeagent/v1/clu-1/stage/\u0663/act",
            id="arabic-indic-stage",
        ),
        pytest.param(
            "edgeagent/v1/clu-1/device/w1\n/status",
            id="device-id-trailing-newline",
        ),
    ],
)
def test_topic_parse_rejects_odd_topics(topic: str) -> None:
    with pytest.raises(ProtocolError):
        T.parse(topic)


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("a/b/c", "a/b/c", True),
        ("a/b/c", "a/b", False),
        ("a/b", "a/b/c", False),
        ("a/+/c", "a/b/c", True),
        ("a/+/c", "a/b/d", False),
        ("a/+/c", "a/b/x/c", False),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/+", "a", False),
        ("a/+", "a/", True),  # + matches an empty level
        ("+/+", "/x", True),
        ("+", "a", True),
        ("+", "a/b", False),
        ("a/#", "a", True),  # MQTT-4.7.1-2: "sport/#" matches "sport" too
        ("a/#", "a/b", True),
        ("a/#", "a/b/c/d", True),
        ("a/#", "b/a", False),
        ("a/#", "ab", False),
        ("#", "a/b/c", True),
        ("+/b/#", "x/b", True),
        ("+/b/#", "x/c/d", False),
        ("a/b", "a/+", False),  # a literal '+' in a topic is not a wildcard match the other way round
    ],
)
def test_topic_matches(pattern: str, topic: str, expected: bool) -> None:
    assert topic_matches(pattern, topic) is expected


# =============================================================================================
# Chunking

FRAME_OVERHEAD = 96


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(min_value=0, max_value=12_000),
    chunk_size=st.integers(min_value=FRAME_OVERHEAD + 1, max_value=5_000),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    dups=st.integers(min_value=0, max_value=5),
)
def test_chunking_round_trip_hypothesis(size: int, chunk_size: int, seed: int, dups: int) -> None:
    rng = random.Random(seed)
    payload = rng.randbytes(size)
    frames = split_payload(payload, chunk_size)
    if size <= chunk_size:
        assert frames == [payload]
        return
    assert len(frames) >= 2
    assert all(is_chunk(f) and len(f) <= chunk_size for f in frames)
    order = frames[:]
    rng.shuffle(order)
    # Duplicates (QoS 1 redelivery) of frames already seen, all before the last distinct frame.
    head, last = order[:-1], order[-1]
    head += [rng.choice(head) for _ in range(dups)]
    rng.shuffle(head)
    r = Reassembler()
    for frame in head:
        assert r.feed("topic/a", frame) is None
    assert r.pending == 1
    assert r.feed("topic/a", last) == payload
    assert r.pending == 0


@pytest.mark.parametrize("size", [0, 1, 999, 1000])
def test_payload_at_or_below_limit_is_not_chunked(size: int) -> None:
    payload = b"\x07" * size
    assert split_payload(payload, 1000) == [payload]


def test_payload_above_limit_is_chunked() -> None:
    payload = bytes(range(256)) * 4 + b"!"  # 1025 bytes
    frames = split_payload(payload, 1024)
    assert len(frames) == 2
    assert all(is_chunk(f) and len(f) <= 1024 for f in frames)
    item = cbor2.loads(frames[0])
    assert item.tag == CHUNK_TAG
    msg_id, index, count, total, digest, _data = item.value
    assert (index, count, total, digest) == (0, 2, 1025, hashlib.sha256(payload).digest())
    # Two splits of the same payload use different message ids.
    assert cbor2.loads(split_payload(payload, 1024)[0]).value[0] != msg_id


@pytest.mark.parametrize("max_size", [0, 10, FRAME_OVERHEAD])
def test_split_rejects_tiny_chunk_size(max_size: int) -> None:
    with pytest.raises(ProtocolError):
        split_payload(b"x" * 1000, max_size)


def test_reassembly_keeps_sources_apart() -> None:
    payload = random.Random(1).randbytes(3000)
    frames = split_payload(payload, 1000)
    r = Reassembler()
    for f in frames[:-1]:
        assert r.feed("src/a", f) is None
        assert r.feed("src/b", f) is None
    assert r.pending == 2
    assert r.feed("src/a", frames[-1]) == payload
    assert r.feed("src/b", frames[-1]) == payload
    assert r.pending == 0


def _flip_last_byte(frame: bytes) -> bytes:
    # The data bytes are the last field of the frame, so the CBOR stays well-formed.
    return frame[:-1] + bytes([frame[-1] ^ 0x01])


@pytest.mark.parametrize("which", [0, 1, -1])
def test_flipped_byte_fails_integrity_check(which: int) -> None:
    payload = random.Random(2).randbytes(5000)
    frames = split_payload(payload, 1500)
    frames[which] = _flip_last_byte(frames[which])
    r = Reassembler()
    for f in frames[:-1]:
        assert r.feed("t", f) is None
    with pytest.raises(ProtocolError, match="integrity"):
        r.feed("t", frames[-1])
    assert r.pending == 0


def _frame(msg_id: Any, index: Any, count: Any, total: Any, digest: Any, data: Any) -> bytes:
    return cbor2.dumps(CBORTag(CHUNK_TAG, [msg_id, index, count, total, digest, data]))


def test_chunk_claiming_more_than_max_message_is_rejected() -> None:
    r = Reassembler(max_message=1000)
    frames = split_payload(b"y" * 1500, 500)
    with pytest.raises(ProtocolError, match="limit 1000"):
        r.feed("t", frames[0])
    with pytest.raises(ProtocolError):
        r.feed("t", _frame("m", 0, 1, 1001, b"\x00" * 32, b""))
    assert r.pending == 0
    # Exactly at the limit is fine.
    ok = b"z" * 1000
    frames = split_payload(ok, 400)
    results = [r.feed("t", f) for f in frames]
    assert results[-1] == ok


def test_chunk_with_more_data_than_announced_is_rejected() -> None:
    r = Reassembler()
    digest = hashlib.sha256(b"abcd").digest()
    assert r.feed("t", _frame("m", 0, 3, 4, digest, b"abc")) is None
    with pytest.raises(ProtocolError, match="more than"):
        r.feed("t", _frame("m", 1, 3, 4, digest, b"def"))
    assert r.pending == 0


def test_chunk_disagreeing_with_earlier_chunks_is_rejected() -> None:
    r = Reassembler()
    digest = hashlib.sha256(b"abcdef").digest()
    assert r.feed("t", _frame("m", 0, 2, 6, digest, b"abc")) is None
    with pytest.raises(ProtocolError, match="disagrees"):
        r.feed("t", _frame("m", 1, 3, 6, digest, b"def"))
    assert r.pending == 0


def test_pending_partials_are_bounded_before_anything_is_kept() -> None:
    r = Reassembler(max_pending=3)
    messages = [random.Random(i).randbytes(700) for i in range(5)]
    split = [split_payload(m, 500) for m in messages]
    assert all(len(frames) == 2 for frames in split)
    for i, frames in enumerate(split[:3]):
        assert r.feed(f"t{i}", frames[0], now=float(i)) is None
    # No room for more: the newcomers are refused (nothing of them kept), the partials already in stay.
    for i, frames in enumerate(split[3:], start=3):
        with pytest.raises(ProtocolError, match="refused a 700-byte message"):
            r.feed(f"t{i}", frames[0], now=3.0)
        with pytest.raises(ProtocolError, match="refused"):  # its other chunks too
            r.feed(f"t{i}", frames[1], now=3.0)
    assert r.pending == 3
    for i, frames in enumerate(split[:3]):
        assert r.feed(f"t{i}", frames[1], now=4.0) == messages[i]
    assert r.pending == 0 and r.buffered == 0


def test_one_source_gets_a_bounded_share_and_the_others_get_through() -> None:
    r = Reassembler(max_pending_per_source=2, max_source_bytes=10_000)
    flood = [split_payload(random.Random(i).randbytes(900), 500) for i in range(50)]
    legit = random.Random(99).randbytes(2000)
    frames = split_payload(legit, 500)
    assert r.feed("other", frames[0]) is None
    refused = 0
    for pieces in flood:
        try:
            r.feed("flood", pieces[0])
        except ProtocolError:
            refused += 1
    assert refused == 48 and r.pending_from("flood") == 2
    assert r.buffered <= 2 * 500 + 500  # two flood partials' first chunks and the legit one's
    for frame in frames[1:-1]:
        assert r.feed("other", frame) is None
    assert r.feed("other", frames[-1]) == legit
    # Bytes: a source announcing more than its share is refused at the first chunk.
    with pytest.raises(ProtocolError, match="announce 0 bytes already"):
        r.feed("greedy", _frame("g", 0, 3, 10_001, b"\0" * 32, b"x"))
    assert r.pending_from("greedy") == 0


def test_a_partial_lives_as_long_as_its_chunks_keep_coming() -> None:
    # A slow link: a chunk every 50 s, far more than a minute in all; never cut off while it moves.
    payload = random.Random(3).randbytes(5000)
    frames = split_payload(payload, 600)
    r = Reassembler(floor=60.0)
    for i, f in enumerate(frames[:-1]):
        assert r.feed("t", f, now=100.0 + 50.0 * i) is None
    assert r.feed("t", frames[-1], now=100.0 + 50.0 * (len(frames) - 1)) == payload

    # Chunks that stop: forgotten after 4x the longest gap so far (at least the floor), and said so.
    r = Reassembler(floor=60.0)
    assert r.feed("t", frames[0], now=0.0) is None
    assert r.feed("t", frames[1], now=30.0) is None  # gap 30 s: kept for 120 s more
    other = split_payload(b"o" * 700, 500)
    assert r.feed("u", other[0], now=149.0) is None
    assert r.pending == 2
    assert r.feed("u", other[1], now=150.5) == b"o" * 700  # expires the first partial
    assert r.pending == 0 and r.expired == 1
    assert r.feed("t", frames[2], now=151.0) is None  # a fresh partial, not a completion
    assert r.pending == 1


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"garbage", id="garbage"),
        pytest.param(b"\xd9\x9c\x41", id="prefix-only"),
        pytest.param(b"\xd9\x9c\x41\xff\xff", id="prefix-then-garbage"),
        pytest.param(cbor2.dumps([1, 2, 3]), id="not-a-tag"),
        pytest.param(cbor2.dumps(CBORTag(40002, ["m", 0, 1, 1, b"", b"x"])), id="other-tag"),
        pytest.param(cbor2.dumps(CBORTag(CHUNK_TAG, "m")), id="tag-around-string"),
        pytest.param(cbor2.dumps(CBORTag(CHUNK_TAG, ["m", 0, 1, 1, b"d"])), id="five-fields"),
        pytest.param(_frame(1, 0, 1, 1, b"d" * 32, b"x"), id="msg-id-not-str"),
        pytest.param(_frame("m", "0", 1, 1, b"d" * 32, b"x"), id="index-not-int"),
        pytest.param(_frame("m", 0, 1, 1, "digest", b"x"), id="digest-not-bytes"),
        pytest.param(_frame("m", 0, 1, 1, b"d" * 32, "x"), id="data-not-bytes"),
        pytest.param(_frame("m", 2, 2, 1, b"d" * 32, b"x"), id="index-out-of-range"),
        pytest.param(_frame("m", -1, 2, 1, b"d" * 32, b"x"), id="negative-index"),
        pytest.param(_frame("m", 0, 1, -1, b"d" * 32, b""), id="negative-total"),
    ],
)
def test_garbage_frames_raise_protocol_error(frame: bytes) -> None:
    r = Reassembler()
    with pytest.raises(ProtocolError):
        r.feed("t", frame)
    assert r.pending == 0


def test_single_frame_message_with_bad_digest_is_rejected() -> None:
    r = Reassembler()
    with pytest.raises(ProtocolError, match="integrity"):
        r.feed("t", _frame("m", 0, 1, 1, b"\x00" * 32, b"x"))


# =============================================================================================
# MemoryTransport


def test_memory_transport_delivers_chunked_payload_whole() -> None:
    broker = MemoryBroker()
    frames_seen: list[int] = []
    route = broker.route

    def spy(topic: str, payload: bytes, retain: bool) -> None:
        frames_seen.append(len(payload))
        route(topic, payload, retain)

    broker.route = spy  # type: ignore[method-assign]
    sender = MemoryTransport(broker, "a", chunk_size=1024)
    receiver = MemoryTransport(broker, "b")
    got: list[tuple[str, bytes]] = []
    receiver.subscribe("data/#", lambda t, p: got.append((t, p)))
    try:
        payload = random.Random(4).randbytes(10_000)
        sender.publish("data/x", payload)
        assert len(frames_seen) > 1 and max(frames_seen) <= 1024
        assert got == [("data/x", payload)]
        sender.publish("other/x", payload)
        assert len(got) == 1
    finally:
        sender.close()
        receiver.close()


def test_memory_transport_retained_for_late_subscribers() -> None:
    broker = MemoryBroker()
    pub = MemoryTransport(broker, "pub")
    try:
        pub.publish("dev/1/status", b"idle", retain=True)
        pub.publish("dev/2/status", b"busy", retain=True)
        pub.publish("dev/3/status", b"not kept")
        late = MemoryTransport(broker, "late")
        got: dict[str, bytes] = {}
        late.subscribe("dev/+/status", lambda t, p: got.__setitem__(t, p))
        assert got == {"dev/1/status": b"idle", "dev/2/status": b"busy"}
        # An empty retained payload clears the retained message.
        pub.publish("dev/1/status", b"", retain=True)
        later = MemoryTransport(broker, "later")
        got2: dict[str, bytes] = {}
        later.subscribe("dev/+/status", lambda t, p: got2.__setitem__(t, p))
        assert got2 == {"dev/2/status": b"busy"}
        late.close()
        later.close()
    finally:
        pub.close()


# =============================================================================================
# Config


def test_config_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "central.yaml"
    path.write_text("workers: 2\ntrain:\n  epoch: 3\n")  # typo: epochs
    with pytest.raises(ConfigError) as info:
        load(CentralConfig, path, {})
    assert str(path) in str(info.value) and "train.epoch" in str(info.value)
    path.write_text("wokers: 2\n")
    with pytest.raises(ConfigError, match=r"unknown key 'wokers'") as info:
        load(CentralConfig, path, {})
    assert str(path) in str(info.value)


def test_config_wrong_type_names_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"<arguments>: workers:"):
        build(CentralConfig, {"workers": "many"})
    with pytest.raises(ConfigError, match=r"train\.learning_rate"):
        build(CentralConfig, {"train": {"learning_rate": -1}}, source="x.yaml")
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  epochs: lots\n")
    with pytest.raises(ConfigError) as info:
        load(CentralConfig, path, {})
    assert str(path) in str(info.value) and "train.epochs" in str(info.value)


def test_config_yaml_syntax_error_names_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("train:\n  epochs: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load(CentralConfig, path, {})
    assert str(path) in str(info.value)
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping") as info:
        load_yaml(path)
    assert str(path) in str(info.value)
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match="cannot read") as info:
        load(CentralConfig, missing, {})
    assert str(missing) in str(info.value)


def test_config_overrides_merge_over_yaml(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("workers: 3\ntrain:\n  epochs: 2\n  batch_size: 8\n")
    cfg = load(CentralConfig, path, {"train": {"epochs": 7}})
    assert cfg.workers == 3 and cfg.train.epochs == 7 and cfg.train.batch_size == 8
    assert load(CentralConfig, None, {}) == CentralConfig()
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load(CentralConfig, empty, {}).train == TrainConfig()


def _repo_configs() -> list[Any]:
    files = sorted((REPO / "configs").glob("**/*.yaml"))
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason="no configs/**/*.yaml yet"), id="none")]
    return [pytest.param(f, id=str(f.relative_to(REPO))) for f in files]


@pytest.mark.parametrize("path", _repo_configs())
def test_repo_training_configs_validate(path: Path) -> None:
    data = load_yaml(path)
    if "train" not in data:
        pytest.skip(f"{path.name} has no train: key (not a central config)")
    # `edgeagent demo` pops its own `demo:` section before validating the rest as a CentralConfig
    # (cli.demo); check that section strictly too, so a typo in it is caught here.
    demo_part = data.pop("demo", None)
    if demo_part is not None:
        assert isinstance(demo_part, dict), f"{path}: demo: must be a mapping"
        build(DemoConfig, demo_part, source=f"{path} (demo:)")
    cfg = build(CentralConfig, data, source=str(path))
    assert isinstance(cfg.train, TrainConfig)


# =============================================================================================
# Partition


def _stage_costs(costs: Sequence[float], points: list[int]) -> list[float]:
    return [sum(costs[a:b]) for a, b in itertools.pairwise(points)]


def _brute_force(costs: Sequence[float], k: int) -> float:
    n = len(costs)
    return min(max(_stage_costs(costs, [0, *cuts, n])) for cuts in itertools.combinations(range(1, n), k - 1))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=9).flatmap(
        lambda costs: st.tuples(st.just(costs), st.integers(min_value=1, max_value=len(costs)))
    )
)
def test_balanced_partition_matches_brute_force(case: tuple[list[int], int]) -> None:
    costs, k = case
    points = balanced_partition([float(c) for c in costs], k)
    check_points(points, len(costs))
    assert len(points) == k + 1
    # Integer costs: exact comparison.
    assert max(_stage_costs(costs, points)) == _brute_force(costs, k)


def test_balanced_partition_matches_brute_force_float_costs() -> None:
    rng = random.Random(11)
    for _ in range(200):
        n = rng.randint(1, 8)
        costs = [rng.uniform(0.0, 5.0) for _ in range(n)]
        k = rng.randint(1, n)
        points = balanced_partition(costs, k)
        check_points(points, n)
        assert max(_stage_costs(costs, points)) == pytest.approx(_brute_force(costs, k), rel=1e-9)


@pytest.mark.parametrize("k", [0, 4, -1])
def test_balanced_partition_rejects_bad_stage_count(k: int) -> None:
    with pytest.raises(ValueError):
        balanced_partition([1.0, 2.0, 3.0], k)


@pytest.mark.parametrize(
    ("points", "n"),
    [
        ([], 3),
        ([0], 0),
        ([3], 3),
        ([1, 3], 3),
        ([0, 2], 3),
        ([0, 4], 3),
        ([0, 2, 2, 3], 3),
        ([0, 3, 2, 3], 3),
        ([0, 0, 3], 3),
        ([0, 1, 3, 3], 3),
    ],
)
def test_check_points_rejects_bad_points(points: list[int], n: int) -> None:
    with pytest.raises(ValueError):
        check_points(points, n)


@pytest.mark.parametrize(("points", "n"), [([0, 3], 3), ([0, 1, 2, 3], 3), ([0, 2, 5], 5)])
def test_check_points_accepts_good_points(points: list[int], n: int) -> None:
    check_points(points, n)
    assert [stage_of_layer(points, layer) for layer in range(n)] == [
        i for i, (a, b) in enumerate(itertools.pairwise(points)) for _ in range(a, b)
    ]
    with pytest.raises(ValueError):
        stage_of_layer(points, n)


def test_a_tensor_field_is_raw_or_compressed_and_decoded_in_the_protocol_layer() -> None:
    from edgeagent.compression import Compressed, get_codec
    from edgeagent.compression.stage import restore

    x = torch.randn(4, 16)
    packed = get_codec("mbq2").compress(x)
    msg = Activation(
        run_id="r", plan_id=0, stage=0, batch_id=3, version=3, mode="train", x=packed, y=torch.zeros(4)
    )
    _, back = decode(encode(msg, sender="c"))
    assert isinstance(back, Activation) and isinstance(back.x, Compressed)
    assert back.x == packed  # checked and typed on decode, not a loose map
    with pytest.raises(ProtocolError, match="still compressed"):
        _ = back.tensor
    torch.testing.assert_close(restore(back.x), get_codec("mbq2").decompress(packed))
    raw = Gradient(run_id="r", plan_id=0, stage=1, batch_id=3, g=x, loss=0.5)
    _, back_raw = decode(encode(raw, sender="w"))
    assert isinstance(back_raw, Gradient) and torch.equal(back_raw.tensor, x)


def test_a_malformed_compressed_tensor_is_rejected_on_decode_with_the_reason() -> None:
    x = torch.randn(4, 16)
    from edgeagent.compression import get_codec

    msg = Activation(
        run_id="r",
        plan_id=0,
        stage=0,
        batch_id=3,
        version=3,
        mode="train",
        x=get_codec("mbq2").compress(x),
        y=torch.zeros(4),
    )

    def cut(env: dict[str, Any]) -> None:
        env["b"]["x"]["data"] = env["b"]["x"]["data"][:3]  # fewer bytes than the shape needs

    with pytest.raises(ProtocolError, match=r"activation\.x: .*fits none of"):
        decode(_reencode(msg, cut))
