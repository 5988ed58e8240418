"""Tests for edgeagent.data: data sets, their determinism and the per-epoch batch order."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from edgeagent.data import (
    DATASET_NAMES,
    Dataset,
    batch_indices,
    batches_per_epoch,
    epoch_order,
    load_dataset,
)


def _assert_same(a: Dataset, b: Dataset) -> None:
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert a.num_classes == b.num_classes


def _check_types(ds: Dataset) -> None:
    assert ds.x_train.dtype == torch.float32 and ds.x_test.dtype == torch.float32
    assert ds.y_train.dtype == torch.int64 and ds.y_test.dtype == torch.int64
    assert ds.x_train.shape[0] == ds.y_train.shape[0]
    assert ds.x_test.shape[0] == ds.y_test.shape[0]
    assert ds.x_test.shape[1:] == ds.x_train.shape[1:]


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits", seed=0)


def test_names() -> None:
    assert DATASET_NAMES == ("digits", "digits28", "synthetic")


def test_digits(digits: Dataset) -> None:
    _check_types(digits)
    assert digits.in_shape == (1, 8, 8)
    assert digits.num_classes == 10
    assert len(digits.y_train) + len(digits.y_test) == 1797
    assert 0.15 < len(digits.y_test) / 1797 < 0.25
    # Standardised with the train statistics.
    assert abs(float(digits.x_train.mean())) < 1e-4
    assert abs(float(digits.x_train.std()) - 1.0) < 1e-3
    # Stratified: every class on both sides.
    assert set(digits.y_train.tolist()) == set(range(10)) == set(digits.y_test.tolist())


def test_digits_deterministic(digits: Dataset) -> None:
    _assert_same(digits, load_dataset("digits", seed=0))
    other = load_dataset("digits", seed=1)
    assert not torch.equal(other.y_train, digits.y_train)


@pytest.mark.parametrize(
    ("name", "n", "shape", "k"),
    [
        ("synthetic:200:1x8x8:4", 200, (1, 8, 8), 4),
        ("synthetic:300:64:5", 300, (64,), 5),
        ("synthetic:100:2X4X4:2", 100, (2, 4, 4), 2),
        ("synthetic:150", 150, (3, 32, 32), 10),
        ("synthetic::16:", 4096, (16,), 10),
    ],
)
def test_synthetic_parsing(name: str, n: int, shape: tuple[int, ...], k: int) -> None:
    ds = load_dataset(name, seed=0)
    _check_types(ds)
    assert ds.in_shape == shape
    assert ds.num_classes == k
    assert len(ds.y_train) + len(ds.y_test) == n
    assert set(ds.y_train.tolist()) == set(range(k)) == set(ds.y_test.tolist())
    assert ds.name == name


def test_synthetic_default() -> None:
    ds = load_dataset("synthetic")
    assert ds.in_shape == (3, 32, 32)
    assert ds.num_classes == 10
    assert len(ds.y_train) + len(ds.y_test) == 4096


def test_synthetic_deterministic() -> None:
    a = load_dataset("synthetic:200:1x8x8:4", seed=3)
    _assert_same(a, load_dataset("synthetic:200:1x8x8:4", seed=3))
    b = load_dataset("synthetic:200:1x8x8:4", seed=4)
    assert not torch.equal(a.x_train, b.x_train)


def test_synthetic_learnable() -> None:
    ds = load_dataset("synthetic:1024:64:8", seed=0)
    # The model's RNG is local to this test; don't disturb the caller's stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, ds.num_classes))
        optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(200):
            idx = batch_indices(len(ds.y_train), 32, epoch=step, seed=0)[0]
            loss = nn.functional.cross_entropy(model(ds.x_train[idx]), ds.y_train[idx])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    with torch.no_grad():
        train_acc = (model(ds.x_train).argmax(1) == ds.y_train).float().mean().item()
        test_acc = (model(ds.x_test).argmax(1) == ds.y_test).float().mean().item()
    assert train_acc > 0.8
    assert test_acc > 0.8


@pytest.mark.parametrize(
    "name",
    [
        "synthetic:abc",
        "synthetic:0:64:2",
        "synthetic:100:8xz:2",
        "synthetic:100:64:0",
        "synthetic:10:64:10",
        "synthetic:1:2:3:4",
    ],
)
def test_synthetic_bad(name: str) -> None:
    with pytest.raises(ValueError, match="synthetic"):
        load_dataset(name)


@pytest.mark.parametrize("name", ["mnist", "synth", "data.csv", ""])
def test_unknown_dataset(name: str) -> None:
    with pytest.raises(ValueError, match="digits") as info:
        load_dataset(name)
    assert ".npz" in str(info.value)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 2])
def test_bad_test_fraction(fraction: float) -> None:
    with pytest.raises(ValueError, match="test_fraction"):
        load_dataset("synthetic:100:4:2", test_fraction=fraction)


def test_npz_split(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 3, 4)).astype(np.float64)
    y = np.arange(50) % 3
    path = tmp_path / "data.npz"
    np.savez(path, X=x, y=y)
    ds = load_dataset(str(path), seed=0, test_fraction=0.2)
    _check_types(ds)
    assert ds.in_shape == (3, 4)
    assert ds.num_classes == 3
    assert len(ds.y_train) + len(ds.y_test) == 50
    # Every original row appears exactly once, with its label.
    rows = torch.cat([ds.x_train, ds.x_test]).reshape(50, -1)
    labels = torch.cat([ds.y_train, ds.y_test])
    original = torch.from_numpy(x.astype(np.float32)).reshape(50, -1)
    order = [int(torch.nonzero((original == r).all(1))[0]) for r in rows]
    assert sorted(order) == list(range(50))
    assert labels.tolist() == [int(y[i]) for i in order]
    _assert_same(ds, load_dataset(str(path), seed=0, test_fraction=0.2))


def test_npz_with_test(tmp_path: Path) -> None:
    x = np.zeros((10, 4), dtype=np.float32)
    y = np.array([0, 1] * 5)
    x_test = np.ones((3, 4), dtype=np.float32)
    y_test = np.array([0, 4, 1])
    path = tmp_path / "data.npz"
    np.savez(path, X=x, y=y, X_test=x_test, y_test=y_test)
    ds = load_dataset(str(path))
    assert torch.equal(ds.x_train, torch.from_numpy(x))
    assert ds.y_train.tolist() == y.tolist()
    assert ds.y_test.tolist() == [0, 4, 1]
    assert ds.num_classes == 5  # max label over train and test + 1


def test_npz_missing_key(tmp_path: Path) -> None:
    path = tmp_path / "nolabels.npz"
    np.savez(path, X=np.zeros((4, 2)))
    with pytest.raises(ValueError, match="'y'") as info:
        load_dataset(str(path))
    assert "nolabels.npz" in str(info.value)


def test_npz_length_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, X=np.zeros((5, 2)), y=np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match="X has 5 samples but y has 4"):
        load_dataset(str(path))


def test_npz_float_labels(tmp_path: Path) -> None:
    path = tmp_path / "floaty.npz"
    np.savez(path, X=np.zeros((5, 2)), y=np.zeros(5))
    with pytest.raises(ValueError, match="integer"):
        load_dataset(str(path))


def test_npz_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_dataset(str(tmp_path / "absent.npz"))


def test_epoch_order() -> None:
    a = epoch_order(100, epoch=0, seed=1)
    assert a.dtype == torch.int64
    assert sorted(a.tolist()) == list(range(100))
    assert torch.equal(a, epoch_order(100, epoch=0, seed=1))
    assert not torch.equal(a, epoch_order(100, epoch=1, seed=1))
    assert not torch.equal(a, epoch_order(100, epoch=0, seed=2))
    assert epoch_order(0, epoch=0, seed=0).numel() == 0


def test_epoch_order_ignores_global_rng() -> None:
    before = torch.get_rng_state()
    torch.manual_seed(0)
    a = epoch_order(50, epoch=3, seed=7)
    torch.manual_seed(1)
    b = epoch_order(50, epoch=3, seed=7)
    torch.set_rng_state(before)
    assert torch.equal(a, b)


@pytest.mark.parametrize(("n", "bs"), [(100, 32), (96, 32), (5, 8), (1, 1)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_batch_indices(n: int, bs: int, drop_last: bool) -> None:
    batches = batch_indices(n, bs, epoch=2, seed=0, drop_last=drop_last)
    assert len(batches) == batches_per_epoch(n, bs, drop_last=drop_last)
    flat = torch.cat(batches).tolist() if batches else []
    assert len(flat) == len(set(flat))
    assert all(0 <= i < n for i in flat)
    if drop_last:
        assert all(len(b) == bs for b in batches)
        assert len(flat) == (n // bs) * bs
    else:
        assert sorted(flat) == list(range(n))
    # The batches are the epoch order cut into pieces.
    assert flat == epoch_order(n, epoch=2, seed=0).tolist()[: len(flat)]


def test_batches_per_epoch() -> None:
    assert batches_per_epoch(100, 32) == 3
    assert batches_per_epoch(100, 32, drop_last=False) == 4
    assert batches_per_epoch(96, 32, drop_last=False) == 3
    assert batches_per_epoch(0, 32) == 0
    with pytest.raises(ValueError, match="batch_size"):
        batches_per_epoch(10, 0)
    with pytest.raises(ValueError, match="batch_size"):
        batch_indices(10, 0, epoch=0, seed=0)
    with pytest.raises(ValueError, match="epoch"):
        epoch_order(10, epoch=-1, seed=0)


# sha256 of x_train, y_train, x_test, y_test (in that order) as scikit-learn's load_digits() gave them
# before the digits shipped as edgeagent/share/data/digits.npz: the same tensors, so every figure measured
# on digits before still holds.
_DIGITS_SHA256 = {
    ("digits", 0): "e56f0cb7750140731e2c6c7822ec27c203cef233686b4f6140ce2a99f5b8b6db",
    ("digits", 7): "a0e73185c77bea9849d83e9a1fb95eedf38240c7b39d5dc5afaebbf68c839556",
    ("digits28", 0): "808ea30f038b46f6c979d93680742fc6f54b38b5eff37352c1b13ebfc912a71b",
    ("digits28", 7): "415530e2ee50624fb086535f49294dfa95fc9f7c4ade1d4210c1647bc4d30adb",
}


@pytest.mark.parametrize(("name", "seed"), sorted(_DIGITS_SHA256))
def test_shipped_digits_give_the_tensors_scikit_learn_gave(name: str, seed: int) -> None:
    ds = load_dataset(name, seed=seed)
    digest = hashlib.sha256()
    for tensor in (ds.x_train, ds.y_train, ds.x_test, ds.y_test):
        digest.update(tensor.numpy().tobytes())
    assert digest.hexdigest() == _DIGITS_SHA256[(name, seed)]
