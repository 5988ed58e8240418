"""Tests for edgeagent.splitfed.partition: IID and non-IID splits among devices and their .npz shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeagent.data import load_dataset
from edgeagent.splitfed.partition import partition, write_shards


def _labels(n: int = 1000, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    y = np.arange(n) % classes
    x = np.random.default_rng(0).normal(size=(n, 1, 4, 4)).astype(np.float32)
    return x, y


@pytest.mark.parametrize("how", ["iid", "noniid"])
@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_parts_are_disjoint_and_cover_every_sample(how: str, k: int) -> None:
    x, y = _labels(1003)
    parts = partition(x, y, k, how, seed=1)  # type: ignore[arg-type]
    assert len(parts) == k
    joined = np.concatenate(parts)
    assert len(joined) == len(y) and set(joined.tolist()) == set(range(len(y)))
    assert all(p.dtype == np.int64 and len(p) > 0 for p in parts)
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 2  # near-equal sizes


def test_iid_parts_see_every_class_in_proportion() -> None:
    x, y = _labels(2000)
    for part in partition(x, y, 4, "iid", seed=3):
        counts = np.bincount(y[part], minlength=10)
        assert counts.min() > 0.5 * counts.mean()


def test_noniid_devices_see_about_two_classes() -> None:
    x, y = _labels(2000)
    parts = partition(x, y, 5, "noniid", seed=3)
    for part in parts:
        assert len(np.unique(y[part])) <= 2  # two shards of 200 label-sorted samples: one class each
    assert len(np.unique(y[partition(x, y, 5, "noniid", seed=3, shards_per_device=5)[0]])) > 2


def test_same_seed_same_parts_other_seed_other_parts() -> None:
    x, y = _labels()
    for how in ("iid", "noniid"):
        a, b = partition(x, y, 3, how, seed=9), partition(x, y, 3, how, seed=9)
        assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
        c = partition(x, y, 3, how, seed=10)
        assert not all(np.array_equal(p, q) for p, q in zip(a, c, strict=True))


def test_shards_load_as_datasets(tmp_path: Path) -> None:
    x, y = _labels(200)
    parts = partition(x, y, 2, "noniid", seed=0)
    paths = write_shards(x, y, parts, tmp_path / "shards", x_test=x[:20], y_test=y[:20])
    assert [p.name for p in paths] == ["device0.npz", "device1.npz"]
    for path, part in zip(paths, parts, strict=True):
        data = load_dataset(str(path))
        assert np.array_equal(data.x_train.numpy(), x[part])
        assert np.array_equal(data.y_train.numpy(), y[part])
        assert len(data.x_test) == 20
    alone = write_shards(x, y, parts[:1], tmp_path, prefix="own")
    assert len(load_dataset(str(alone[0])).x_test) > 0  # no common test set: the device splits its own


def test_bad_input_is_refused(tmp_path: Path) -> None:
    x, y = _labels(10)
    with pytest.raises(ValueError, match="k \\(devices\\)"):
        partition(x, y, 0, "iid", seed=0)
    with pytest.raises(ValueError, match="at least one sample"):
        partition(x, y, 11, "iid", seed=0)
    with pytest.raises(ValueError, match="unknown split"):
        partition(x, y, 2, "dirichlet", seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot make 12 shards"):
        partition(x, y, 6, "noniid", seed=0)
    with pytest.raises(ValueError, match="one label per sample"):
        partition(x, y[:5], 2, "iid", seed=0)
    with pytest.raises(ValueError, match="empty"):
        write_shards(x, y, [np.array([], dtype=np.int64)], tmp_path)
