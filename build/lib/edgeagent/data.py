"""Data sets and deterministic batch orders, identical on every device that loads them.

Every device of a pipeline loads the same data set with the same seed and derives the same batch order
from ``(seed, epoch)``, so a micro-batch is named by its index alone and labels never travel over the
network. Nothing here downloads anything: ``digits`` ships with scikit-learn, ``synthetic`` is generated
and ``.npz`` files are read from local disk.
"""

from __future__ import annotations

import hashlib
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "DATASET_NAMES",
    "Dataset",
    "batch_indices",
    "batches_per_epoch",
    "epoch_order",
    "load_dataset",
]

DATASET_NAMES: tuple[str, ...] = ("digits", "digits28", "synthetic")

_ALLOWED_FORMS = (
    "'digits', 'digits28' (upsampled to 28x28), 'synthetic', "
    "'synthetic:N:CxHxW:K' (e.g. 'synthetic:4096:3x32x32:10'), "
    "'synthetic:N:F:K' (flat features, e.g. 'synthetic:4096:64:10') or a path to a '.npz' file "
    "with keys X and y (optional X_test, y_test)"
)

_SYNTHETIC_DEFAULTS: tuple[int, tuple[int, ...], int] = (4096, (3, 32, 32), 10)

# Noise relative to unit-variance prototypes: visible, yet classes stay separable so training converges.
_SYNTHETIC_NOISE_STD = 1.0


@dataclass(frozen=True)
class Dataset:
    """A train/test split held in memory as tensors.

    ``x_*`` are float32 of shape (N, *in_shape); ``y_*`` are int64 class indices of shape (N,).
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    @property
    def in_shape(self) -> tuple[int, ...]:
        """Shape of one sample, without the batch dimension."""
        return tuple(self.x_train.shape[1:])


def _derived_seed(*parts: object) -> int:
    """A stable 63-bit seed; hashlib rather than hash() so every process derives the same value."""
    digest = hashlib.sha256(":".join(str(p) for p in ("edgeagent.data", *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def _check_test_fraction(test_fraction: float) -> None:
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, int | float):
        raise ValueError(f"test_fraction must be a number strictly between 0 and 1, got {test_fraction!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be strictly between 0 and 1, got {test_fraction!r}")


def _stratified_split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-class shuffled split so every class with >= 2 samples appears in both train and test."""
    rng = np.random.default_rng(_derived_seed("split", seed))
    train_parts: list[np.ndarray] = []
    test_parts: list[np.ndarray] = []
    for cls in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == cls))
        # A lone sample is worth more for training than as a one-sample test set.
        n_test = min(max(round(len(idx) * test_fraction), 1), len(idx) - 1) if len(idx) >= 2 else 0
        test_parts.append(idx[:n_test])
        train_parts.append(idx[n_test:])
    # Shuffle across classes too so train/test are not sorted by label.
    train = rng.permutation(np.concatenate(train_parts))
    test = rng.permutation(np.concatenate(test_parts))
    if len(test) == 0:
        raise ValueError(
            f"cannot split {len(y)} samples with test_fraction={test_fraction}: "
            "no class has 2 or more samples"
        )
    return train, test


def _make_dataset(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
) -> Dataset:
    return Dataset(
        name=name,
        x_train=torch.from_numpy(np.ascontiguousarray(x_train, dtype=np.float32)),
        y_train=torch.from_numpy(np.ascontiguousarray(y_train, dtype=np.int64)),
        x_test=torch.from_numpy(np.ascontiguousarray(x_test, dtype=np.float32)),
        y_test=torch.from_numpy(np.ascontiguousarray(y_test, dtype=np.int64)),
        num_classes=num_classes,
    )


def _load_digits(name: str, seed: int, test_fraction: float) -> Dataset:
    from sklearn.datasets import load_digits  # deferred: sklearn import is slow and only digits needs it

    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]  # (N, 1, 8, 8) in [0, 1]
    if name == "digits28":  # MNIST-sized (papers/001's 784-512-10 MLP): bilinear upsampling
        up = torch.nn.functional.interpolate(torch.from_numpy(x), size=(28, 28), mode="bilinear")
        x = up.numpy()  # (N, 1, 28, 28)
    y = digits.target.astype(np.int64)  # (N,)
    train, test = _stratified_split(y, test_fraction, seed)
    # One scalar mean/std (a single channel): per-pixel std is 0 on the always-blank border pixels.
    mean = float(x[train].mean())
    std = float(x[train].std())
    x = (x - mean) / std
    return _make_dataset(name, x[train], y[train], x[test], y[test], 10)


def _parse_int_field(text: str, field: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"data set {name!r}: {field} must be a positive int, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"data set {name!r}: {field} must be a positive int, got {text!r}")
    return value


def _parse_synthetic(name: str) -> tuple[int, tuple[int, ...], int]:
    """Parse 'synthetic[:N[:SHAPE[:K]]]'; empty fields take the defaults."""
    fields = name.split(":")[1:]
    if len(fields) > 3:
        raise ValueError(f"data set {name!r} has too many ':' fields; allowed forms: {_ALLOWED_FORMS}")
    n, shape, k = _SYNTHETIC_DEFAULTS
    if len(fields) >= 1 and fields[0]:
        n = _parse_int_field(fields[0], "N (number of samples)", name)
    if len(fields) >= 2 and fields[1]:
        shape = tuple(_parse_int_field(d, "shape entry", name) for d in fields[1].lower().split("x"))
    if len(fields) >= 3 and fields[2]:
        k = _parse_int_field(fields[2], "K (number of classes)", name)
    if n < 2 * k:
        raise ValueError(
            f"data set {name!r}: N={n} must be at least 2*K={2 * k} so each class has train and test"
        )
    return n, shape, k


def _load_synthetic(name: str, seed: int, test_fraction: float) -> Dataset:
    """Per-class random prototypes plus gaussian noise, balanced classes, all from one seeded generator."""
    n, shape, k = _parse_synthetic(name)
    gen = torch.Generator().manual_seed(_derived_seed("synthetic", seed))
    prototypes = torch.randn((k, *shape), generator=gen)  # (K, *shape)
    y = torch.arange(n) % k  # balanced labels  # (N,)
    y = y[torch.randperm(n, generator=gen)]
    x = prototypes[y] + _SYNTHETIC_NOISE_STD * torch.randn((n, *shape), generator=gen)  # (N, *shape)
    y_np = y.numpy()
    train, test = _stratified_split(y_np, test_fraction, seed)
    x_np = x.numpy()
    return _make_dataset(name, x_np[train], y_np[train], x_np[test], y_np[test], k)


def _check_labels(y: np.ndarray, key: str, path: str) -> np.ndarray:
    if y.ndim != 1:
        raise ValueError(f"{path}: {key} must be 1-D class labels, got shape {y.shape}")
    if y.dtype.kind not in "iub":
        raise ValueError(f"{path}: {key} must hold integer class labels, got dtype {y.dtype}")
    if len(y) and y.min() < 0:
        raise ValueError(f"{path}: {key} must hold labels 0..K-1, got minimum {int(y.min())}")
    return y.astype(np.int64)


def _check_features(x: np.ndarray, key: str, path: str) -> np.ndarray:
    if x.ndim < 2:
        raise ValueError(f"{path}: {key} must have shape (N, *in_shape) with ndim >= 2, got shape {x.shape}")
    if x.dtype.kind not in "fiub":
        raise ValueError(f"{path}: {key} must be numeric, got dtype {x.dtype}")
    x = x.astype(np.float32)
    if not np.isfinite(x).all():
        raise ValueError(f"{path}: {key} contains NaN or infinite values")
    return x


def _load_npz(name: str, seed: int, test_fraction: float) -> Dataset:
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"data set file {name!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"data set file {name!r} is not a readable .npz file ({exc})") from exc
    for key in ("X", "y"):
        if key not in arrays:
            raise ValueError(
                f"data set file {name!r} has no key {key!r}; required keys: X, y (optional: X_test, y_test); "
                f"found: {sorted(arrays)}"
            )
    if ("X_test" in arrays) != ("y_test" in arrays):
        raise ValueError(
            f"data set file {name!r} must have both X_test and y_test or neither; found: {sorted(arrays)}"
        )
    x = _check_features(arrays["X"], "X", name)
    y = _check_labels(arrays["y"], "y", name)
    if len(x) != len(y):
        raise ValueError(f"data set file {name!r}: X has {len(x)} samples but y has {len(y)}")
    if "X_test" in arrays:
        x_test = _check_features(arrays["X_test"], "X_test", name)
        y_test = _check_labels(arrays["y_test"], "y_test", name)
        if len(x_test) != len(y_test):
            raise ValueError(
                f"data set file {name!r}: X_test has {len(x_test)} samples but y_test has {len(y_test)}"
            )
        if x_test.shape[1:] != x.shape[1:]:
            raise ValueError(
                f"data set file {name!r}: X_test sample shape {x_test.shape[1:]} differs from X {x.shape[1:]}"
            )
        if len(x) == 0 or len(x_test) == 0:
            raise ValueError(f"data set file {name!r}: X has {len(x)} and X_test {len(x_test)} samples")
        x_train, y_train = x, y
    else:
        if len(x) < 2:
            raise ValueError(f"data set file {name!r}: X has {len(x)} samples; need at least 2 to split")
        train, test = _stratified_split(y, test_fraction, seed)
        x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    return _make_dataset(name, x_train, y_train, x_test, y_test, num_classes)


def load_dataset(name: str, *, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """Load a data set by name; the same ``(name, seed, test_fraction)`` gives identical tensors everywhere.

    ``name`` is ``"digits"`` (scikit-learn's 8x8 digits, standardised with the train mean/std),
    ``"synthetic"`` or ``"synthetic:N:CxHxW:K"`` / ``"synthetic:N:F:K"`` (N samples in total, before the
    split; defaults 4096, 3x32x32, 10), or a path ending in ``.npz`` with keys ``X`` and ``y`` and
    optionally ``X_test`` and ``y_test`` (when absent, the data is split by ``test_fraction``).
    """
    _check_test_fraction(test_fraction)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if not isinstance(name, str):
        raise ValueError(f"data set name must be a string, got {name!r}; allowed forms: {_ALLOWED_FORMS}")
    if name in ("digits", "digits28"):
        return _load_digits(name, seed, test_fraction)
    if name == "synthetic" or name.startswith("synthetic:"):
        return _load_synthetic(name, seed, test_fraction)
    if name.lower().endswith(".npz"):
        return _load_npz(name, seed, test_fraction)
    raise ValueError(f"unknown data set {name!r}; allowed forms: {_ALLOWED_FORMS}")


def _check_count(value: int, what: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}, got {value!r}")


def epoch_order(n: int, *, epoch: int, seed: int) -> torch.Tensor:
    """A permutation of ``range(n)`` (int64) fixed by ``(seed, epoch)``; the global RNG is not used."""
    _check_count(n, "n", 0)
    _check_count(epoch, "epoch", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    gen = torch.Generator().manual_seed(_derived_seed("epoch", seed, epoch))
    return torch.randperm(n, generator=gen)  # (n,)


def batches_per_epoch(n: int, batch_size: int, drop_last: bool = True) -> int:
    """Number of batches :func:`batch_indices` yields for ``n`` samples."""
    _check_count(n, "n", 0)
    _check_count(batch_size, "batch_size", 1)
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def batch_indices(
    n: int, batch_size: int, *, epoch: int, seed: int, drop_last: bool = True
) -> list[torch.Tensor]:
    """Sample indices of each batch of one epoch, in order; each index appears at most once.

    With ``drop_last`` the final short batch is dropped, so every batch has exactly ``batch_size`` indices
    (the pipeline relies on fixed shapes between stages).
    """
    _check_count(batch_size, "batch_size", 1)
    order = epoch_order(n, epoch=epoch, seed=seed)  # (n,)
    batches = list(order.split(batch_size))
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches
