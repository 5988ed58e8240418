"""FedAvg over complete models (PiPar eq. 3) and the state-dict helpers of split-federated training: pure
tensor functions, no I/O.

A state is a model's ``state_dict`` with keys ``<layer>.<name>`` (``nn.Sequential`` numbering over the
whole model). A device holds layers ``[0, P)``; its server-side model layers ``[P, L)`` numbered from 0,
so :func:`shift` renumbers them, and :func:`layer_range` cuts a whole model's state.
"""

from __future__ import annotations

import hashlib

import torch


def _layer(key: str) -> int:
    head, _, _ = key.partition(".")
    if not head.isdigit():
        raise ValueError(f"state key {key!r} does not start with a layer number")
    return int(head)


def shift(state: dict[str, torch.Tensor], by: int) -> dict[str, torch.Tensor]:
    """The same tensors with every layer number moved by ``by`` (``layers [P, L)`` <-> ``[0, L - P)``)."""
    out = {}
    for key, value in state.items():
        _, _, rest = key.partition(".")
        out[f"{_layer(key) + by}.{rest}"] = value
    return out


def layer_range(state: dict[str, torch.Tensor], start: int, end: int) -> dict[str, torch.Tensor]:
    """The entries of layers ``[start, end)``, keys unchanged."""
    return {k: v for k, v in state.items() if start <= _layer(k) < end}


def fedavg(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """``sum_k w_k state_k / sum_k w_k`` per entry (eq. 3 with ``w_k = |D_k|``); integer entries (a
    BatchNorm's batch counter) are taken from the first state. Every state must have the same keys."""
    if not states or len(states) != len(weights) or sum(weights) <= 0:
        raise ValueError(f"FedAvg of {len(states)} states with weights {weights}: need one positive each")
    keys = set(states[0])
    for k, state in enumerate(states[1:], 1):
        if set(state) != keys:
            raise ValueError(f"state {k} has keys {sorted(set(state) ^ keys)[:4]} the first does not share")
    total = float(sum(weights))
    out = {}
    for key, first in states[0].items():
        if not first.is_floating_point():
            out[key] = first.clone()
            continue
        acc = torch.zeros_like(first, dtype=torch.float64)
        for state, w in zip(states, weights, strict=True):
            acc += state[key].to(torch.float64) * (w / total)
        out[key] = acc.to(first.dtype)
    return out


def state_checksum(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 (hex, 16 characters) over the entries in key order: names, shapes, dtypes and bytes."""
    digest = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().contiguous().cpu()
        digest.update(f"{key}:{tuple(t.shape)}:{t.dtype};".encode())
        digest.update(t.numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()[:16]


__all__ = ["fedavg", "layer_range", "shift", "state_checksum"]
