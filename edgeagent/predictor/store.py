"""Trained predictors on disk, and the samples of collected records.

A predictor file holds the variant, the model's per-layer FLOPs, the normalisation, the networks'
weights, the pre-training data ``D`` (for the adaptive update) and the data set's provenance. It is
written with ``torch.save`` and read with ``torch.load(..., weights_only=True)`` only: tensors, numbers,
strings, lists and dicts, never pickled objects.

The predictors of the built-in models ship in ``edgeagent/predictor/weights/<model key>.pt``
(``edgeagent predictor train`` writes them); :func:`shipped` finds the one of a model, if any.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from edgeagent.models import ModelSpec
from edgeagent.predictor.measure import model_key
from edgeagent.predictor.net import VARIANTS, DualStream, LatencyPredictor, Sample, _Norm
from edgeagent.predictor.submodels import REPRESENTATIVES, representative

FORMAT = 1
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


def record_h(record: Mapping[str, Any]) -> tuple[float, ...]:
    """A record's ``h``: its representative sub-models' times *from the record's own sweep* (the paper
    selects them from the same measurements). The ``h`` the child measured first, in a fresh process, is
    kept in the record too; on this shared 2-core machine it differs from the sweep's by up to 2x on
    two-thread configurations (cold thread pool and allocator), which is noise, not the device."""
    times = {
        (int(s), int(e)): float(t) for (s, e), t in zip(record["ranges"], record["seconds"], strict=True)
    }
    return tuple(times[r] for r in representative(record["flops"]))


def samples_of(records: Iterable[Mapping[str, Any]]) -> list[Sample]:
    """Every (sub-model, h, seconds) measured in ``records`` (see :mod:`edgeagent.predictor.collect`)."""
    out: list[Sample] = []
    for record in records:
        h = record_h(record)
        for (start, end), seconds in zip(record["ranges"], record["seconds"], strict=True):
            out.append(Sample(int(start), int(end), h, float(seconds)))
    return out


def save(predictor: LatencyPredictor, path: Path, *, model: ModelSpec, provenance: Mapping[str, Any]) -> None:
    """Write ``predictor`` for ``model`` to ``path`` (atomically)."""
    data = torch.tensor(
        [[s.start, s.end, *s.h, s.seconds] for s in predictor.data], dtype=torch.float64
    ).reshape(-1, REPRESENTATIVES + 3)
    payload = {
        "format": FORMAT,
        "variant": predictor.variant,
        "model": model.to_dict(),
        "model_key": model_key(model),
        "layer_flops": list(predictor.layer_flops),
        "norm": predictor.norm.to_dict(),
        "seed": predictor.seed,
        "nets": [net.state_dict() for net in predictor.nets],
        "data": data,
        "provenance": dict(provenance),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)


def _field(payload: Mapping[str, Any], name: str, path: Path) -> Any:
    if name not in payload:
        raise ValueError(
            f"{path}: not a predictor file (no {name!r}); build one with `edgeagent predictor train`"
        )
    return payload[name]


def load(path: Path) -> tuple[LatencyPredictor, dict[str, Any]]:
    """A predictor and its header (model, model_key, provenance) from ``path``; ValueError if malformed."""
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise ValueError(f"{path}: cannot read a predictor file ({exc})") from None
    if not isinstance(payload, dict) or _field(payload, "format", path) != FORMAT:
        raise ValueError(
            f"{path}: predictor file format {payload.get('format')!r}, this version reads {FORMAT}"
        )
    variant = _field(payload, "variant", path)
    if variant not in VARIANTS:
        raise ValueError(f"{path}: unknown predictor variant {variant!r}")
    flops = tuple(float(v) for v in _field(payload, "layer_flops", path))
    if not flops or not all(math.isfinite(v) and v >= 0 for v in flops):
        raise ValueError(f"{path}: layer FLOPs must be finite and >= 0")
    nets = []
    for state in _field(payload, "nets", path):
        try:
            width = int(state["s_stream.0.weight"].shape[0])  # the layers' width, as it was trained
            net = DualStream(len(flops) + (1 if variant == "features" else 0), width)
            net.load_state_dict(state)
        except (RuntimeError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"{path}: weights do not fit a {len(flops)}-layer predictor ({exc})") from None
        net.eval()
        nets.append(net)
    rows = _field(payload, "data", path)
    data = [
        Sample(int(r[0]), int(r[1]), tuple(float(v) for v in r[2:-1]), float(r[-1])) for r in rows.tolist()
    ]
    norm = _Norm(**{k: float(v) for k, v in _field(payload, "norm", path).items()})
    predictor = LatencyPredictor(variant, flops, nets, norm, data, int(payload.get("seed", 0)))
    header = {k: payload.get(k) for k in ("model", "model_key", "provenance")}
    return predictor, header


def shipped_path(model: ModelSpec) -> Path:
    return WEIGHTS_DIR / f"{model_key(model)}.pt"


def shipped_provenance(model: ModelSpec) -> dict[str, Any] | None:
    """The provenance recorded in the predictor that ships for ``model`` (None: none ships, or it cannot
    be read; :func:`shipped` says why when a run loads it)."""
    path = shipped_path(model)
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError):
        return None
    provenance = payload.get("provenance") if isinstance(payload, dict) else None
    return dict(provenance) if isinstance(provenance, dict) else None


def shipped(model: ModelSpec) -> LatencyPredictor | None:
    """The predictor that ships for ``model`` (None if there is none)."""
    path = shipped_path(model)
    if not path.exists():
        return None
    predictor, _header = load(path)
    return predictor


__all__ = [
    "FORMAT",
    "WEIGHTS_DIR",
    "load",
    "record_h",
    "samples_of",
    "save",
    "shipped",
    "shipped_path",
    "shipped_provenance",
]
