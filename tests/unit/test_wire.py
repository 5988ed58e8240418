"""The envelope (``protocol/wire.py``): JSON or CBOR by kind; bad envelopes, wrong versions, garbage
and edge-case payloads raise ProtocolError only."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeagent.errors import ProtocolError
from edgeagent.protocol.commands import Command
from edgeagent.protocol.messages import (
    Kind,
    MessageKind,
)
from edgeagent.protocol.wire import FORMAT_VERSION, decode, encode
from tests.unit.protocol_samples import (
    KINDS,
    SAMPLES,
    drop,
    put,
    reencode,
)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_message_encoding_is_json_or_cbor(kind: Kind) -> None:
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


BAD_ENVELOPES = [
    # (id, message, mutation, regex the error must match)
    ("version-missing", MessageKind.COMMIT, drop(("v",)), r"version None"),
    ("version-0-json", MessageKind.HEARTBEAT, put(("v",), 0), r"version 0\b.*\b1\b"),
    ("version-string", MessageKind.COMMIT, put(("v",), "1"), r"version '1'"),
    ("unknown-kind", MessageKind.COMMIT, put(("k",), "teleport"), r"unknown message kind 'teleport'"),
    ("kind-missing", MessageKind.STATUS, drop(("k",)), r"unknown message kind"),
    ("sender-not-str", MessageKind.STATUS, put(("s",), 5), r"sender"),
    ("body-not-map", MessageKind.COMMIT, put(("b",), [1, 2]), r"body"),
    (
        "unknown-field-json",
        MessageKind.STATUS,
        put(("b", "colour"), "red"),
        r"unknown fields \['colour'\]",
    ),
    ("unknown-field-cbor", MessageKind.ACTIVATION, put(("b", "z"), 1), r"unknown fields \['z'\]"),
    ("missing-field-json", MessageKind.HEARTBEAT, drop(("b", "seq")), r"lacks field 'seq'"),
    ("missing-field-cbor", MessageKind.ACTIVATION, drop(("b", "x")), r"lacks field 'x'"),
    ("batch-id-as-string", MessageKind.ACTIVATION, put(("b", "batch_id"), "17"), r"activation\.batch_id"),
    ("bool-for-int", MessageKind.HEARTBEAT, put(("b", "seq"), True), r"heartbeat\.seq.*bool"),
    ("float-for-int", MessageKind.READY, put(("b", "stage"), 1.0), r"ready\.stage"),
    ("nan-for-float-cbor", MessageKind.GRADIENT, put(("b", "loss"), math.nan), r"gradient\.loss.*finite"),
    ("nan-for-float-json", MessageKind.HEARTBEAT, put(("b", "interval"), math.nan), r"interval.*finite"),
    ("inf-for-float", MessageKind.EVAL_RESULT, put(("b", "loss_sum"), math.inf), r"loss_sum.*finite"),
    ("bool-for-float", MessageKind.ASSIGN, put(("b", "learning_rate"), True), r"learning_rate"),
    ("str-for-float", MessageKind.ANNOUNCE, put(("b", "slowdown"), "fast"), r"announce\.slowdown"),
    ("int-for-str", MessageKind.STATUS, put(("b", "state"), 3), r"status\.state"),
    ("null-for-str", MessageKind.DISCOVER, put(("b", "run_id"), None), r"discover\.run_id"),
    ("list-item-type", MessageKind.ASSIGN, put(("b", "points"), [0, "2", 9]), r"assign\.points\[1\]"),
    ("list-not-list", MessageKind.ASSIGN, put(("b", "worker_list"), "w1"), r"worker_list"),
    ("dict-not-dict", MessageKind.COMMAND, put(("b", "args"), [1]), r"command\.args"),
    ("tensor-as-list", MessageKind.ACTIVATION, put(("b", "x"), [[1.0, 2.0]]), r"tensor"),
    ("tensor-dict-value", MessageKind.WEIGHTS, put(("b", "tensors"), {"w": 1}), r"tensor"),
    ("optional-tensors", MessageKind.ASSIGN, put(("b", "weights"), {"w": "x"}), r"assign\.weights"),
    ("stage-times-str", MessageKind.GRADIENT, put(("b", "stage_times"), ["x"]), r"stage_times\[0\]"),
    # Fields with a fixed set of values: the error names the field, the value and the allowed values.
    ("state-unknown", MessageKind.STATUS, put(("b", "state"), "up"), r"status\.state: 'up' is not one of"),
    (
        "state-case",
        MessageKind.STATUS,
        put(("b", "state"), "Idle"),
        r"'Idle' is not one of 'online', 'idl",
    ),
    (
        "mode-unknown",
        MessageKind.ACTIVATION,
        put(("b", "mode"), "t"),
        r"activation\.mode.*'train', 'eval'",
    ),
    ("phase-unknown", MessageKind.READY, put(("b", "phase"), "done"), r"ready\.phase: 'done'.*'alive'"),
    ("purpose-unknown", MessageKind.WEIGHTS, put(("b", "purpose"), "x"), r"weights\.purpose.*'global'"),
    ("code-unknown", MessageKind.ERROR, put(("b", "code"), "oops"), r"error\.code: 'oops'.*'assign'"),
    ("assign-mode", MessageKind.ASSIGN, put(("b", "mode"), 3), r"assign\.mode: expected str"),
    (
        "assign-options",
        MessageKind.ASSIGN,
        put(("b", "options", "learning_rate"), "fast"),
        r"assign\.options\.learning_rate: expected a number",
    ),
    (
        "assign-options-map",
        MessageKind.ASSIGN,
        put(("b", "options"), [0.1]),
        r"assign\.options: expected a map",
    ),
    ("literal-not-str", MessageKind.WEIGHTS, put(("b", "purpose"), 1), r"weights\.purpose: 1 is not one"),
    ("literal-list", MessageKind.READY, put(("b", "phase"), ["built"]), r"ready\.phase: .*, got list"),
    ("literal-long", MessageKind.STATUS, put(("b", "state"), "x" * 1000), r"'x{35}\.\.\.' is not one of"),
]


@pytest.mark.parametrize(
    ("kind", "mutate", "pattern"), [b[1:] for b in BAD_ENVELOPES], ids=[b[0] for b in BAD_ENVELOPES]
)
def test_decode_rejects_bad_envelopes(kind: MessageKind, mutate: Any, pattern: str) -> None:
    payload = reencode(SAMPLES[kind], mutate)
    with pytest.raises(ProtocolError, match=pattern):
        decode(payload)


@pytest.mark.parametrize("kind", [MessageKind.HEARTBEAT, MessageKind.ACTIVATION], ids=lambda k: k.value)
def test_decode_rejects_wrong_version_naming_both(kind: MessageKind) -> None:
    payload = reencode(SAMPLES[kind], put(("v",), FORMAT_VERSION + 1))
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
