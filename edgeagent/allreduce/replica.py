"""One full replica of the model in data-parallel training: gradients, updates and digests over the flat
vector of its parameters (what the collectives move).

Every device, the parameter server and the tests' single-process reference use this same class, so the
arithmetic of an update is the same everywhere: the collective averages the devices' gradient *sums*
over their batches, and :meth:`Replica.apply` divides by the batch size, so an update is the mean over
every sample of the step.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from edgeagent.models import ModelSpec, build_model
from edgeagent.pipeline.sgd import SGD
from edgeagent.protocol.options import TrainOptions


class Replica:
    """The model, its SGD optimizer (the run's options) and the flat views the collectives need."""

    def __init__(self, spec: ModelSpec, seed: int, options: TrainOptions) -> None:
        self.model: nn.Module = build_model(spec, seed=seed)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.size = sum(p.numel() for p in self.params)
        self.optimizer = SGD(self.params, options)
        self.loss_fn = nn.CrossEntropyLoss(reduction="sum")

    def flat(self) -> torch.Tensor:
        """The parameters as one flat float32 vector (a copy)."""
        return torch.cat([p.detach().reshape(-1) for p in self.params]).float()  # (size,)

    def load_flat(self, flat: torch.Tensor, *, reset_momentum: bool = True) -> None:
        """Take these parameters (a joiner's start, the parameter server's model); momentum starts anew, so
        that every replica loading the same vector is the same replica."""
        self._check(flat, "weights")
        with torch.no_grad():
            offset = 0
            for p in self.params:
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        if reset_momentum:
            self.optimizer.state.clear()

    def gradient(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The flat gradient of the loss summed over the batch, and that summed loss."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel()) for p in self.params]
        return torch.cat(grads).float(), float(loss.item())

    def apply(self, averaged: torch.Tensor, batch_size: int) -> None:
        """One SGD step with ``averaged / batch_size`` (the collective's mean of the devices' sums)."""
        self._check(averaged, "averaged gradient")
        offset = 0
        for p in self.params:
            p.grad = averaged[offset : offset + p.numel()].view_as(p) / batch_size  # a new tensor
            offset += p.numel()
        self.optimizer.step()

    def snapshot(self) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Parameters and optimizer state, to undo an update (:meth:`restore`)."""
        return self.flat(), self.optimizer.state_dict()

    def restore(self, snap: tuple[torch.Tensor, dict[int, torch.Tensor]]) -> None:
        self.load_flat(snap[0], reset_momentum=False)
        self.optimizer.load_state_dict(snap[1])

    def collect_state(self) -> dict[str, torch.Tensor]:
        """The model's state dict (a copy): what ``--save-model`` writes."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def digest(self) -> str:
        """SHA-256 (16 hex digits) of the parameters' bytes: equal on replicas holding the same model.

        The bytes of :meth:`flat`, hashed parameter by parameter from their own buffers (no copy of the
        model per step) when they are contiguous float32, as they are on every replica we build."""
        h = hashlib.sha256()
        if all(p.dtype == torch.float32 and p.is_contiguous() for p in self.params):
            for p in self.params:
                h.update(p.detach().numpy().data)
        else:
            h.update(self.flat().numpy().data)
        return h.hexdigest()[:16]

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> tuple[float, float]:
        """(accuracy, mean loss) on ``x``, ``y``."""
        self.model.eval()
        correct, loss = 0, 0.0
        for i in range(0, len(x), batch_size):
            out = self.model(x[i : i + batch_size])
            loss += float(self.loss_fn(out, y[i : i + batch_size]).item())
            correct += int((out.argmax(dim=1) == y[i : i + batch_size]).sum().item())
        n = max(1, len(x))
        return correct / n, loss / n

    def _check(self, flat: torch.Tensor, what: str) -> None:
        if flat.dim() != 1 or flat.numel() != self.size:
            raise ValueError(f"{what} of shape {tuple(flat.shape)}: the model has {self.size} parameters")
