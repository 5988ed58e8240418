"""Each device's own data: a data set split among K devices, IID or non-IID by label, and written as shards.

Note: the non-IID split.
    PiPar's Sec. 5 trains on IID data only and does not say how it would split by label; it aggregates
    with FedAvg [28], so the non-IID split here is FedAvg's own (McMahan et al., Sec. 3, "pathological
    non-IID"): the samples sorted by label are cut into ``shards_per_device x K`` shards of (nearly) equal
    size and every device gets ``shards_per_device`` of them at random, so with 2 shards a device sees
    about two classes. No sample is dropped and every device gets at least one shard's worth.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

__all__ = ["partition", "write_shards"]


def _check(n: int, k: int, seed: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (devices) must be an int >= 1, got {k!r}")
    if n < k:
        raise ValueError(f"cannot give {k} devices at least one sample each from {n} samples")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")


def partition(
    x: np.ndarray,
    y: np.ndarray,
    k: int,
    how: Literal["iid", "noniid"],
    seed: int,
    *,
    shards_per_device: int = 2,
) -> list[np.ndarray]:
    """Indices of each device's samples (int64, disjoint, together all of ``range(len(y))``).

    ``"iid"``: a seeded permutation cut into ``k`` near-equal parts. ``"noniid"``: the module note.
    The same ``(y, k, how, seed)`` gives the same parts on every machine.
    """
    y = np.asarray(y)
    if len(x) != len(y) or y.ndim != 1:
        raise ValueError(f"x has {len(x)} samples and y shape {y.shape}; need one label per sample")
    n = len(y)
    _check(n, k, seed)
    rng = np.random.default_rng(seed)
    if how == "iid":
        return [np.sort(part).astype(np.int64) for part in np.array_split(rng.permutation(n), k)]
    if how != "noniid":
        raise ValueError(f"unknown split {how!r}; allowed: 'iid', 'noniid'")
    if isinstance(shards_per_device, bool) or not isinstance(shards_per_device, int) or shards_per_device < 1:
        raise ValueError(f"shards_per_device must be an int >= 1, got {shards_per_device!r}")
    shards = shards_per_device * k
    if n < shards:
        raise ValueError(f"{n} samples cannot make {shards} shards ({shards_per_device} per device x {k})")
    # Shuffle first, then sort stably: each class's samples end up in random order within the class.
    shuffled = rng.permutation(n)
    by_label = shuffled[np.argsort(y[shuffled], kind="stable")]
    pieces = np.array_split(by_label, shards)
    order = rng.permutation(shards)
    return [
        np.sort(
            np.concatenate([pieces[s] for s in order[d * shards_per_device : (d + 1) * shards_per_device]])
        ).astype(np.int64)
        for d in range(k)
    ]


def write_shards(
    x: np.ndarray,
    y: np.ndarray,
    parts: Sequence[np.ndarray],
    directory: str | Path,
    *,
    prefix: str = "device",
    x_test: np.ndarray | None = None,
    y_test: np.ndarray | None = None,
) -> list[Path]:
    """Write part i as ``directory/{prefix}{i}.npz`` with keys X and y, which ``--dataset FILE.npz`` loads.

    A common test set (``x_test``, ``y_test``) is written into every shard as X_test and y_test, so a
    device evaluates on the same data as the others instead of splitting its own.
    """
    if (x_test is None) != (y_test is None):
        raise ValueError("give both x_test and y_test or neither")
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, part in enumerate(parts):
        idx = np.asarray(part, dtype=np.int64)
        if len(idx) == 0:
            raise ValueError(f"part {i} is empty; every device needs data")
        arrays: dict[str, Any] = {"X": np.asarray(x)[idx], "y": np.asarray(y)[idx].astype(np.int64)}
        if x_test is not None and y_test is not None:
            arrays["X_test"] = np.asarray(x_test)
            arrays["y_test"] = np.asarray(y_test).astype(np.int64)
        path = out_dir / f"{prefix}{i}.npz"
        np.savez(path, **arrays)
        paths.append(path)
    return paths
