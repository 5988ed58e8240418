"""The wire format: every message in its envelope, encoded and decoded with every field checked.

Every payload is an envelope ``{"v": FORMAT_VERSION, "k": kind, "s": sender, "b": body}``. Messages
that carry tensors (the data plane, assignments, weights) are CBOR; status, heartbeats, metrics,
events and commands are JSON so that ``mosquitto_sub -v -t 'edgeagent/#'`` shows them readably.
Tensors are RFC 8746 typed arrays (see :mod:`edgeagent.protocol.tensors`); nothing is pickled.
:func:`decode` builds the message class of the envelope's kind (:data:`MESSAGE_TYPES`; a command's by
its name) and checks every field against its type, ``Literal`` values included.

A training mode's own messages are not imported here: the registry (:data:`edgeagent.mode_names.MODES`)
names the module that declares them, and :func:`message_types` loads it on the first decode (the
protocol never imports a mode by name; the messages modules hold nothing heavier than torch).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, Union

import cbor2
import torch

from edgeagent.compression.base import Compressed, from_wire, to_wire
from edgeagent.errors import ProtocolError
from edgeagent.mode_names import MODES
from edgeagent.protocol.commands import COMMAND_TYPES, Command
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
    GradSync,
    Heartbeat,
    Kind,
    LinkReport,
    Message,
    Metrics,
    Probe,
    Profile,
    Ready,
    Repartition,
    Status,
    Weights,
    field_names,
)
from edgeagent.protocol.options import TrainOptions
from edgeagent.protocol.tensors import decode_tensor, encode_tensor

FORMAT_VERSION = 1
MAX_DECODE_BYTES = 256 * 1024 * 1024

# The messages every mode shares, by kind.
_SHARED: dict[Kind, type[Message]] = {
    cls.KIND: cls
    for cls in (
        Discover,
        Announce,
        Status,
        Heartbeat,
        Assign,
        Ready,
        Activation,
        Gradient,
        EvalResult,
        Command,
        Weights,
        Commit,
        Metrics,
        Event,
        ErrorReport,
        Probe,
        Profile,
        LinkReport,
        Repartition,
        FetchRequest,
        GradSync,
    )
}
# The registry's messages modules last loaded, and every class by kind and by its wire name.
_loaded: tuple[tuple[str, ...], dict[Kind, type[Message]], dict[str, type[Message]]] = (
    (),
    _SHARED,
    {k.value: cls for k, cls in _SHARED.items()},
)


def message_types() -> dict[Kind, type[Message]]:
    """Every message class by its kind: the shared ones and those of every registered mode (the module its
    registry entry names declares them in ``MESSAGES``), loaded on first use and again when the registry
    names other modules (a test's mode). Two classes of one kind are a programming error."""
    return _load()[1]


def _load() -> tuple[tuple[str, ...], dict[Kind, type[Message]], dict[str, type[Message]]]:
    global _loaded
    modules = tuple(entry.messages for entry in MODES.values() if entry.messages)
    if modules == _loaded[0]:
        return _loaded
    found = dict(_SHARED)
    for name in modules:
        for cls in importlib.import_module(name).MESSAGES:
            if found.setdefault(cls.KIND, cls) is not cls:
                raise TypeError(f"{name}.{cls.__name__}: kind {cls.KIND.value!r} is {found[cls.KIND]}'s")
    _loaded = (modules, found, {k.value: cls for k, cls in found.items()})
    return _loaded


class _MessageTypes(Mapping[Kind, type[Message]]):
    """:func:`message_types` as a mapping that reads the registry when used, not when imported."""

    def __getitem__(self, kind: Kind) -> type[Message]:
        return message_types()[kind]

    def __iter__(self) -> Iterator[Kind]:
        return iter(message_types())

    def __len__(self) -> int:
        return len(message_types())


MESSAGE_TYPES: Mapping[Kind, type[Message]] = _MessageTypes()


def encode(msg: Message, *, sender: str) -> bytes:
    """Serialise a message into its envelope (CBOR or JSON, by the message's kind)."""
    body = {name: getattr(msg, name) for name in field_names(type(msg))}
    if isinstance(msg, Command):
        run_id = body.pop("run_id")
        body = {"run_id": run_id, "name": msg.NAME, "args": body}
    envelope = {"v": FORMAT_VERSION, "k": msg.KIND.value, "s": sender, "b": body}
    if msg.ENCODING == "json":
        try:
            return json.dumps(envelope, separators=(",", ":"), allow_nan=False).encode()
        except ValueError as exc:  # NaN or infinity, e.g. a diverging loss in metrics
            raise ProtocolError(f"{msg.KIND.value} has a value JSON cannot carry: {exc}") from exc
    return cbor2.dumps(_to_cbor(envelope))


_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})  # CBOR carries these as they are


def _to_cbor(value: Any) -> Any:
    if type(value) in _PLAIN:  # most of a message's fields: five isinstance checks fewer each
        return value
    if isinstance(value, torch.Tensor):
        return encode_tensor(value)
    if isinstance(value, Compressed):
        return to_wire(value)
    if isinstance(value, TrainOptions):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _to_cbor(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_cbor(v) for v in value]
    return value


def decode(payload: bytes, *, open_values: bool = False) -> tuple[str, Message]:
    """Return ``(sender, message)``. Raises :class:`ProtocolError` on anything malformed.

    ``open_values`` accepts any string in a field with a fixed set of values (``Status.state``, say):
    for observers such as the monitor, which show a newer device's new state rather than drop it. The
    roles never set it: they act on these values.
    """
    if len(payload) > MAX_DECODE_BYTES:
        raise ProtocolError(f"payload of {len(payload)} bytes exceeds the {MAX_DECODE_BYTES}-byte limit")
    if not payload:
        raise ProtocolError("empty payload")
    try:
        envelope = json.loads(payload) if payload[:1] == b"{" else cbor2.loads(payload)
    except Exception as exc:  # json and cbor2 raise many types for garbage
        raise ProtocolError(f"undecodable payload of {len(payload)} bytes: {exc}") from exc
    if not isinstance(envelope, dict):
        raise ProtocolError(f"envelope must be a map, got {type(envelope).__name__}")
    version = envelope.get("v")
    if type(version) is not int or version != FORMAT_VERSION:
        raise ProtocolError(
            f"format version {version!r} is not supported (this side speaks {FORMAT_VERSION})"
        )
    kind = envelope.get("k")
    cls = _load()[2].get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message kind {kind!r}")
    sender, body = envelope.get("s"), envelope.get("b")
    if not isinstance(sender, str) or not isinstance(body, dict):
        raise ProtocolError(f"{kind} envelope lacks a sender string or a body map")
    checker = _OPEN if open_values else _STRICT
    if cls is Command:
        return sender, _build_command(body, checker)
    return sender, _build(cls, body, checker)


def _build_command(body: dict[str, Any], checker: _Checker) -> Command:
    name, args = body.get("name"), body.get("args", {})
    cls = COMMAND_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ProtocolError(f"unknown command {name!r}; known: {sorted(COMMAND_TYPES)}")
    if not isinstance(args, dict):
        raise ProtocolError(f"command.args: expected a map, got {type(args).__name__}")
    unknown = set(body) - {"run_id", "name", "args"}
    if unknown:
        raise ProtocolError(f"command {name!r} has unknown fields {sorted(unknown)}")
    if "run_id" in args:
        raise ProtocolError(f"command {name!r}: run_id belongs in the body, not in args")
    command = _build(cls, {**args, "run_id": body.get("run_id")}, checker)
    assert isinstance(command, Command)
    return command


@dataclasses.dataclass(frozen=True)
class _Schema:
    """A message class's fields as :func:`_build` checks them, worked out once (get_type_hints is slow):
    per field its name, type, whether it may be left out (it has a default) and where it is named in an
    error (``<kind>.<field>``, for a message)."""

    names: frozenset[str]
    fields: tuple[tuple[str, Any, bool, str], ...]


_SCHEMAS: dict[type[Any], _Schema] = {}


def _schema(cls: type[Any]) -> _Schema:
    schema = _SCHEMAS.get(cls)
    if schema is None:
        hints = typing.get_type_hints(cls)
        kind = getattr(cls, "KIND", None)
        prefix = kind.value if isinstance(kind, Kind) else ""
        schema = _SCHEMAS[cls] = _Schema(
            frozenset(f.name for f in dataclasses.fields(cls)),
            tuple(
                (
                    f.name,
                    hints[f.name],
                    f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
                    f"{prefix}.{f.name}",
                )
                for f in dataclasses.fields(cls)
            ),
        )
    return schema


def _build(cls: type[Any], body: dict[str, Any], checker: _Checker, name: str = "") -> Any:
    """``cls`` (a message, or a record inside one) from a decoded map, every field checked."""
    schema = _schema(cls)
    if not name:
        name = cls.KIND.value
        named = True  # a message: its fields' error names are worked out in the schema
    else:
        named = False
    if not all(isinstance(k, str) for k in body):
        raise ProtocolError(f"{name} body has non-string keys")
    if not schema.names.issuperset(body):
        raise ProtocolError(f"{name} has unknown fields {sorted(set(body) - schema.names)}")
    values: dict[str, Any] = {}
    check = checker.check
    for field_name, tp, optional, where in schema.fields:
        if field_name not in body:
            if not optional:
                raise ProtocolError(f"{name} lacks field {field_name!r}")
            continue
        values[field_name] = check(tp, body[field_name], where if named else f"{name}.{field_name}")
    return cls(**values)


_args = functools.cache(typing.get_args)  # once per type, not once per value checked


class _Checker:
    """Checks a decoded value against a field's type and returns it in that type (tensors decoded).

    One method per kind of type: generic types (``list[int]``, ``X | None``, ``Literal[...]``) by their
    origin, plain types by themselves.
    """

    def __init__(self, *, open_values: bool = False) -> None:
        self.open_values = open_values

    def check(self, tp: Any, value: Any, where: str) -> Any:
        try:
            method = _METHODS[tp]
        except KeyError:
            origin = typing.get_origin(tp)
            method = _METHODS[tp] = _BY_ORIGIN.get(origin) if origin is not None else _BY_TYPE.get(tp)
        if method is None:
            # A programming error (a field type without a decoder), reported like bad input.
            raise ProtocolError(f"{where}: no decoder for {tp}")
        return method(self, tp, value, where)

    def _union(self, tp: Any, value: Any, where: str) -> Any:
        problems = []
        for arg in _args(tp):
            try:
                return self.check(arg, value, where)
            except ProtocolError as exc:
                problems.append(str(exc))
        raise ProtocolError(f"{where}: {type(value).__name__} fits none of {tp} ({'; '.join(problems)})")

    def _literal(self, tp: Any, value: Any, where: str) -> Any:
        allowed = _args(tp)
        if any(type(value) is type(a) and value == a for a in allowed):
            return value
        if self.open_values and all(isinstance(a, str) for a in allowed) and isinstance(value, str):
            return value
        values = ", ".join(repr(a) for a in allowed)
        if not isinstance(value, (str, int, float, bool)):
            raise ProtocolError(f"{where}: expected one of {values}, got {type(value).__name__}")
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:36] + "...'"
        raise ProtocolError(f"{where}: {shown} is not one of {values}")

    def _none(self, tp: Any, value: Any, where: str) -> None:
        if value is not None:
            raise ProtocolError(f"{where}: expected null")

    def _any(self, tp: Any, value: Any, where: str) -> Any:
        return value

    def _tensor(self, tp: Any, value: Any, where: str) -> torch.Tensor:
        return decode_tensor(value)

    def _record(self, tp: Any, value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected a map, got {type(value).__name__}")
        return _build(tp, value, self, where)

    def _compressed(self, tp: Any, value: Any, where: str) -> Compressed:
        try:
            return from_wire(value)
        except ProtocolError as exc:
            raise ProtocolError(f"{where}: {exc}") from None

    def _float(self, tp: Any, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(f"{where}: expected a number, got {type(value).__name__}")
        try:
            number = float(value)
        except OverflowError:
            raise ProtocolError(f"{where}: {str(value)[:20]}... does not fit a float") from None
        if not math.isfinite(number):
            raise ProtocolError(f"{where}: expected a finite number, got {number}")
        return number

    def _scalar(self, tp: Any, value: Any, where: str) -> Any:
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ProtocolError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
        return value

    def _list(self, tp: Any, value: Any, where: str) -> list[Any]:
        if not isinstance(value, (list, tuple)):
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = _args(tp)
        return [self.check(item, v, f"{where}[{i}]") for i, v in enumerate(value)]

    def _tuple(self, tp: Any, value: Any, where: str) -> tuple[Any, ...]:
        """``tuple[X, ...]`` only (a record's frozen sequence), sent as a list."""
        args = typing.get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise ProtocolError(f"{where}: no decoder for {tp}")
        if not isinstance(value, (list, tuple)):
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(self.check(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))

    def _dict(self, tp: Any, value: Any, where: str) -> dict[Any, Any]:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected a map, got {type(value).__name__}")
        key_t, val_t = _args(tp)
        return {
            self.check(key_t, k, f"{where} key"): self.check(val_t, v, f"{where}[{k!r}]")
            for k, v in value.items()
        }


_Method = Callable[[_Checker, Any, Any, str], Any]
_BY_ORIGIN: dict[Any, _Method] = {
    Union: _Checker._union,
    types.UnionType: _Checker._union,
    Literal: _Checker._literal,
    list: _Checker._list,
    tuple: _Checker._tuple,
    dict: _Checker._dict,
}
_BY_TYPE: dict[Any, _Method] = {
    type(None): _Checker._none,
    Any: _Checker._any,
    torch.Tensor: _Checker._tensor,
    Compressed: _Checker._compressed,
    TrainOptions: _Checker._record,
    float: _Checker._float,
    int: _Checker._scalar,
    str: _Checker._scalar,
    bytes: _Checker._scalar,
    bool: _Checker._scalar,
}
# The method of every type checked so far (get_origin once per type, not once per value).
_METHODS: dict[Any, _Method | None] = {}
_STRICT, _OPEN = _Checker(), _Checker(open_values=True)
