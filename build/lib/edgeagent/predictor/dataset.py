"""The predictor's data set on disk: one JSON document (``format``, ``provenance``, ``records``), one
record per resource configuration, validated on load (see :mod:`.collect`, which writes it)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeagent.models import ModelSpec
from edgeagent.predictor.configs import ResourceConfig, _positive_int
from edgeagent.predictor.measure import model_key
from edgeagent.predictor.submodels import REPRESENTATIVES, all_ranges

FORMAT = 1

_RECORD_KEYS = (
    "config", "model", "model_key", "batch_size", "num_layers", "flops", "h", "ranges", "seconds", "reps",
    "torch", "host", "cpu", "measured_at",
)  # fmt: skip


def _numbers(value: Any, what: str, length: int, *, positive: bool) -> None:
    if not isinstance(value, list) or len(value) != length:
        got = len(value) if isinstance(value, list) else type(value).__name__
        raise ValueError(f"{what} must be a list of {length} numbers, got {got}")
    bound = "> 0" if positive else ">= 0"
    for i, x in enumerate(value):
        number = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
        if not number or x < 0 or (positive and x == 0):
            raise ValueError(f"{what}[{i}] must be a finite number {bound}, got {x!r}")


def check_record(record: Any) -> None:
    """Raise ValueError saying what is wrong with one record (keys, types, lengths, consistency)."""
    if not isinstance(record, dict):
        raise ValueError(f"a record must be an object, got {type(record).__name__}")
    missing = [k for k in _RECORD_KEYS if k not in record]
    if missing:
        raise ValueError(f"missing keys {missing}")
    cfg = ResourceConfig.from_dict(record["config"])
    spec = ModelSpec.from_dict(record["model"])
    if record["model_key"] != model_key(spec):
        raise ValueError(f"model_key {record['model_key']!r} is not the model's ({model_key(spec)!r})")
    if record["batch_size"] != cfg.batch_size:
        raise ValueError(f"batch_size {record['batch_size']!r} is not the config's ({cfg.batch_size})")
    _positive_int(record["reps"], "reps", 10_000)
    for key in ("torch", "host", "cpu", "measured_at"):
        if not isinstance(record[key], str):
            raise ValueError(f"{key} must be a string, got {record[key]!r}")
    layers = record["num_layers"]
    _positive_int(layers, "num_layers", 10_000)
    _numbers(record["flops"], "flops", layers, positive=False)
    _numbers(record["h"], "h", REPRESENTATIVES, positive=True)
    expected = [list(r) for r in all_ranges(layers)]
    if record["ranges"] != expected:
        raise ValueError(f"ranges must be all {len(expected)} sub-models of {layers} layers, in order")
    _numbers(record["seconds"], "seconds", len(expected), positive=True)
    if "round_seconds" in record:  # every round's window (collections since ROUNDS)
        rounds = record.get("rounds", 0)
        _positive_int(rounds, "rounds", 1000)
        windows = record["round_seconds"]
        if not isinstance(windows, list) or len(windows) != len(expected):
            raise ValueError(f"round_seconds must hold {len(expected)} lists, one per sub-model")
        for i, w in enumerate(windows):
            _numbers(w, f"round_seconds[{i}]", rounds, positive=True)


def load_document(path: str | Path) -> dict[str, Any]:
    """The whole data set (``format``, ``provenance``, ``records``), validated; ValueError names the file
    and what is wrong with it."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON document ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: the document must be an object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: format must be {FORMAT}, got {doc.get('format')!r}")
    if not isinstance(doc.get("provenance"), dict):
        raise ValueError(f"{path}: provenance must be an object")
    records = doc.get("records")
    if not isinstance(records, list):
        raise ValueError(f"{path}: records must be a list, got {type(records).__name__}")
    seen: set[str] = set()
    for i, record in enumerate(records):
        try:
            check_record(record)
        except ValueError as e:
            raise ValueError(f"{path}: record {i}: {e}") from None
        name = record["config"]["name"]
        if name in seen:
            raise ValueError(f"{path}: record {i}: configuration {name!r} appears twice")
        seen.add(name)
    return doc


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a data set written by :func:`collect` (validated, see :func:`load_document`)."""
    records: list[dict[str, Any]] = load_document(path)["records"]
    return records


def dumps_document(provenance: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> str:
    """The data set as JSON with one line per record (small diffs when a collection is re-run)."""
    lines = ["{", f' "format": {FORMAT},', f' "provenance": {json.dumps(provenance, sort_keys=True)},']
    body = [f"  {json.dumps(r, sort_keys=True)}" for r in records]
    lines += [' "records": [', ",\n".join(body), " ]", "}"] if body else [' "records": []', "}"]
    return "\n".join(lines) + "\n"


__all__ = ["FORMAT", "check_record", "dumps_document", "load_document", "load_records"]
