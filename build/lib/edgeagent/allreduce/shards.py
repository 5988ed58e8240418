"""Each device's shard of the data in data-parallel training, and the batches of every step (pure).

Every device loads the same data set with the same seed and takes its shard by its index in the run's
worker list: ``iid`` deals a seeded permutation out round-robin; ``noniid`` (by label) sorts the samples
by label and cuts the order into contiguous pieces, so each device sees few classes. A step's batch on a
device is named by ``(step, its shard)`` alone, so a step run again (a member died) computes the same
gradient, and the single-process reference of the tests sees the same batches.
"""

from __future__ import annotations

from typing import Literal

import torch

from edgeagent.data import epoch_order

Split = Literal["iid", "noniid"]


def shard(labels: torch.Tensor, index: int, count: int, split: Split, seed: int) -> torch.Tensor:
    """Indices (int64) of shard ``index`` of ``count`` over samples with these ``labels``."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index} of {count}")
    n = len(labels)
    order = epoch_order(n, epoch=0, seed=seed)  # (n,)
    if split == "iid":
        return order[index::count].clone()
    by_label = order[torch.argsort(labels[order], stable=True)]  # seeded within each class
    size = n // count
    return by_label[index * size : (index + 1) * size].clone()


def steps_per_epoch(n: int, count: int, batch_size: int) -> int:
    """Steps of one epoch: every device takes ``batch_size`` samples per step from its shard (the smallest
    shard decides; at least one step)."""
    return max(1, (n // count) // batch_size)


def batch(indices: torch.Tensor, step: int, per_epoch: int, batch_size: int, seed: int) -> torch.Tensor:
    """The sample indices of ``step`` on the device holding shard ``indices`` (reshuffled every epoch)."""
    epoch, k = divmod(step, per_epoch)
    order = epoch_order(len(indices), epoch=epoch + 1, seed=seed)
    return indices[order[k * batch_size : (k + 1) * batch_size]]
