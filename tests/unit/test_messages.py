"""Messages (``protocol/messages.py``): every kind has a class and round trips; enumerated fields take
exactly their values; tensor fields are raw or compressed."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest
import torch

from edgeagent.errors import ProtocolError
from edgeagent.protocol.chunking import is_chunk
from edgeagent.protocol.commands import COMMAND_TYPES, Resend, ResendKind, Stop
from edgeagent.protocol.messages import (
    Activation,
    ActivationMode,
    ErrorCode,
    ErrorReport,
    Gradient,
    Heartbeat,
    Kind,
    Message,
    MessageKind,
    Ready,
    ReadyPhase,
    Status,
    StatusState,
    Weights,
    WeightsPurpose,
)
from edgeagent.protocol.wire import MESSAGE_TYPES, decode, encode
from tests.unit.protocol_samples import (
    HAND_SAMPLES,
    KINDS,
    SAMPLES,
    assert_same_message,
    auto_sample,
    put,
    reencode,
)

REPO = Path(__file__).resolve().parents[2]


def test_every_message_kind_has_a_class_and_samples() -> None:
    assert set(MESSAGE_TYPES) == set(KINDS)
    for kind, cls in MESSAGE_TYPES.items():
        assert cls.KIND is kind and cls.ENCODING in ("json", "cbor")
    for kind, msg in HAND_SAMPLES.items():
        assert isinstance(msg, MESSAGE_TYPES[kind])


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_message_round_trip_auto_sample(kind: Kind) -> None:
    # A command is one of its subclasses (the base has no name): every one of them round-trips.
    classes = list(COMMAND_TYPES.values()) if kind is MessageKind.COMMAND else [MESSAGE_TYPES[kind]]
    for cls in classes:
        msg = auto_sample(cls)
        sender, out = decode(encode(msg, sender="auto"))
        assert sender == "auto"
        assert type(out) is cls
        assert_same_message(msg, out)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_message_round_trip(kind: Kind) -> None:
    msg = SAMPLES[kind]
    payload = encode(msg, sender="dev-1")
    sender, out = decode(payload)
    assert sender == "dev-1"
    assert_same_message(msg, out)
    assert not is_chunk(payload)


def test_message_defaults_round_trip() -> None:
    # Fields left at their defaults are sent and come back as defaults.
    _, out = decode(encode(Heartbeat(device_id="w", seq=1), sender="w"))
    assert out == Heartbeat(device_id="w", seq=1, run_id="", stage=-1, interval=1.0)
    # A body that omits defaulted fields (a hand-written command) decodes with the defaults.
    raw = json.dumps({"v": 1, "k": "command", "s": "user", "b": {"run_id": "r", "name": "stop"}}).encode()
    assert decode(raw) == ("user", Stop(run_id="r"))


ENUMERATIONS = {
    (Status, "state"): StatusState,
    (Activation, "mode"): ActivationMode,
    (Ready, "phase"): ReadyPhase,
    (Weights, "purpose"): WeightsPurpose,
    (ErrorReport, "code"): ErrorCode,
}
COMMAND_ENUMERATIONS: dict[tuple[type[Message], str], Any] = {(Resend, "kind"): ResendKind}


def test_an_enumerated_command_argument_takes_exactly_its_values() -> None:
    for value in typing.get_args(ResendKind):
        _, out = decode(encode(Resend(run_id="r", device="w", plan_id=1, since=0, kind=value), sender="c"))
        assert isinstance(out, Resend) and out.kind == value
    bad = encode(Resend(run_id="r", device="w", plan_id=1, since=0, kind="other"), sender="c")  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="kind"):
        decode(bad)


@pytest.mark.parametrize(("cls", "name"), list(ENUMERATIONS), ids=lambda v: getattr(v, "__name__", v))
def test_enumerated_fields_take_exactly_their_values(cls: type[Message], name: str) -> None:
    alias = ENUMERATIONS[(cls, name)]
    assert typing.get_type_hints(cls)[name] is alias
    kind = cls.KIND
    for value in typing.get_args(alias):
        _, out = decode(reencode(SAMPLES[kind], put(("b", name), value)))
        assert getattr(out, name) == value
    with pytest.raises(ProtocolError, match=rf"{kind.value}\.{name}: 'other' is not one of"):
        decode(reencode(SAMPLES[kind], put(("b", name), "other")))
    # Observers (the monitor) may take a value newer than their code; still only a string.
    _, out = decode(reencode(SAMPLES[kind], put(("b", name), "other")), open_values=True)
    assert getattr(out, name) == "other"
    with pytest.raises(ProtocolError, match=rf"{kind.value}\.{name}"):
        decode(reencode(SAMPLES[kind], put(("b", name), 7)), open_values=True)


def test_enumerations_are_tested_and_documented() -> None:
    for cls in [*MESSAGE_TYPES.values(), *COMMAND_TYPES.values()]:
        for name, tp in typing.get_type_hints(cls).items():
            if typing.get_origin(tp) is typing.Literal:
                enumerated = (cls, name) in ENUMERATIONS or (cls, name) in COMMAND_ENUMERATIONS
                assert enumerated, f"{cls.__name__}.{name} is enumerated: test it"
    doc = (REPO / "docs" / "protocol.md").read_text(encoding="utf-8")
    for alias in [*ENUMERATIONS.values(), *COMMAND_ENUMERATIONS.values()]:
        for value in typing.get_args(alias):
            assert f"`{value}`" in doc, f"docs/protocol.md does not list {value!r}"


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
        decode(reencode(msg, cut))
