"""One pipeline stage's compute: forward and backward of single batches with weight stashing.

Note: weight stashing and vertical sync.
    ``version`` counts the optimizer updates a stage has applied. The central node tags each batch
    with its own version when it forwards it; every later stage forwards that batch with *its*
    weights of the same version (vertical sync, papers/000 Sec. III-C), and its backward pass uses
    exactly those weights (weight stashing). Stages apply updates in batch order, so a later stage
    always already has the version a batch asks for; it keeps every version a batch in flight or a
    future batch can still ask for, as separate tensors. Forward passes run through
    ``torch.func.functional_call`` on detached leaves of those stashed tensors, so the optimizer can
    update the live parameters in place without tripping autograd's version counters (the bug that
    froze PipeDream at PyTorch 1.4).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from edgeagent.errors import TrainingError
from edgeagent.pipeline.backward import backward_with
from edgeagent.pipeline.sgd import SGD


class StageModule(nn.Module):
    """Layers ``[start, end)`` of the model, keyed by their global index so names survive a re-split."""

    def __init__(self, layers: dict[int, nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): m for i, m in sorted(layers.items())})

    @property
    def start(self) -> int:
        return min(int(k) for k in self.layers) if len(self.layers) else 0

    @property
    def end(self) -> int:
        return max(int(k) for k in self.layers) + 1 if len(self.layers) else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x


@dataclass
class _InFlight:
    version: int
    inputs: torch.Tensor  # leaf requiring grad (not on stage 0)
    output: torch.Tensor
    params: dict[str, torch.Tensor]


@dataclass(frozen=True)
class BackwardResult:
    grad_input: torch.Tensor | None  # None on stage 0
    loss: float
    correct: int
    # Hybrid stages (``total`` given): the last stage's loss and correctness of each of its rows, and,
    # with ``defer``, the parameter gradients not yet applied (:meth:`Stage.apply_gradients`).
    row_loss: torch.Tensor | None = None
    row_correct: torch.Tensor | None = None
    param_grads: dict[str, torch.Tensor] | None = None


@dataclass(frozen=True)
class TrainOptions:
    """The optimizer settings every stage of a run shares: the one type for them, from the run's
    ``TrainConfig`` (:meth:`of`) to ``Assign`` and every stage built."""

    learning_rate: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    aggregation: bool = False
    # Aggregate every window * interval updates (the paper: "an interval which is a multiple of n - i").
    aggregation_interval: int = 1

    @classmethod
    def of(cls, source: object) -> TrainOptions:
        """The options of a run's training settings (``TrainConfig``) or of an ``Assign``."""
        return cls(**{name: getattr(source, name) for name in cls.__dataclass_fields__})


class Stage:
    """A stage's sub-model, optimizer, stash of weight versions and batches in flight."""

    def __init__(
        self,
        module: StageModule,
        options: TrainOptions,
        *,
        is_first: bool,
        is_last: bool,
        version: int = 0,
        aggregation_window: int = 1,
    ) -> None:
        self.module = module
        self.options = options
        # Versions concurrently used on this stage: n - i for stage i of n (papers/000 Sec. III-C).
        self.aggregation_window = aggregation_window
        self.is_first = is_first
        self.is_last = is_last
        params = list(module.parameters())
        self.optimizer = SGD(params, options) if params else None
        self.version = version
        self._stash: dict[int, dict[str, torch.Tensor]] = {version: self._snapshot()}
        self._in_flight: dict[int, _InFlight] = {}
        self._floor = version  # no future batch asks for a version below this
        self._recent: list[dict[str, torch.Tensor]] = []  # last versions, for aggregation
        # Hybrid stages: the version of every batch not yet updated here, kept stashed so the batch can
        # be computed again (a replica of the stage died with some of its rows).
        self._pinned: dict[int, int] = {}

    # -- bookkeeping -----------------------------------------------------------------------------

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self.module.named_parameters()}

    @property
    def stashed_versions(self) -> list[int]:
        return sorted(self._stash)

    def has_version(self, version: int) -> bool:
        """Whether weight version ``version`` is stashed here (a forward may ask for it)."""
        return version in self._stash

    @property
    def in_flight(self) -> list[int]:
        return sorted(self._in_flight)

    def _prune(self) -> None:
        keep = {v.version for v in self._in_flight.values()} | {self.version} | set(self._pinned.values())
        for version in list(self._stash):
            if version < self._floor and version not in keep:
                del self._stash[version]

    def drop_in_flight(self) -> None:
        """Forget batches in flight (after a fault or a re-split); their updates never happen."""
        self._in_flight.clear()
        self._pinned.clear()
        self._floor = self.version
        self._prune()

    def pin(self, batch_id: int, version: int) -> None:
        """Keep ``version`` stashed until batch ``batch_id``'s update is applied (:meth:`unpin`)."""
        self._pinned[batch_id] = version

    def unpin(self, batch_id: int) -> None:
        self._pinned.pop(batch_id, None)
        self._prune()

    def forget(self, batch_id: int) -> None:
        """Drop one batch's forward (it is computed again with other rows); its version stays pinned."""
        self._in_flight.pop(batch_id, None)

    # -- compute -------------------------------------------------------------------------------

    def forward(self, batch_id: int, x: torch.Tensor, version: int | None = None) -> tuple[torch.Tensor, int]:
        """Forward a training batch with weight version ``version`` (``None``: the newest).

        Returns the output (detached, to send on) and the version used.
        """
        version = self.version if version is None else version
        if version not in self._stash:
            raise TrainingError(
                f"batch {batch_id} asks for weight version {version}, stashed: {self.stashed_versions}"
            )
        if batch_id in self._in_flight:
            raise TrainingError(f"batch {batch_id} forwarded twice")
        self._floor = max(self._floor, version)
        params = {name: t.detach().requires_grad_(True) for name, t in self._stash[version].items()}
        inputs = x if self.is_first else x.detach().requires_grad_(True)
        self.module.train()
        output = functional_call(self.module, params, (inputs,))  # (B, ...)
        self._in_flight[batch_id] = _InFlight(version, inputs, output, params)
        self._prune()
        return output.detach(), version

    def backward(
        self,
        batch_id: int,
        grad_output: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        total: int = 0,
        defer: bool = False,
    ) -> BackwardResult:
        """Backward of an earlier forward: the last stage passes ``labels``, the others ``grad_output``.

        Uses the weights the batch was forwarded with, then applies the update to the live weights.
        Hybrid stages: ``total`` (the last stage) is the whole batch's rows, of which this stage computed
        some: the loss is the sum of its rows' losses over ``total``, so the members' gradients add up to
        the whole batch's; ``defer`` returns the parameter gradients instead of applying them.
        """
        entry = self._in_flight.pop(batch_id, None)
        if entry is None:
            raise TrainingError(
                f"backward of batch {batch_id}, which is not in flight here ({self.in_flight})"
            )
        loss_value, correct = 0.0, 0
        row_loss = row_correct = None
        if self.is_last and total:
            if labels is None:
                raise TrainingError("the last stage needs the labels to compute the loss")
            per_row = F.cross_entropy(entry.output, labels, reduction="none")
            (per_row.sum() / total).backward()
            row_loss = per_row.detach()
            row_correct = (entry.output.detach().argmax(dim=1) == labels).to(torch.int64)
            loss_value, correct = float(row_loss.sum()) / total, int(row_correct.sum())
        elif self.is_last:
            if labels is None:
                raise TrainingError("the last stage needs the labels to compute the loss")
            loss = F.cross_entropy(entry.output, labels)
            loss.backward()
            loss_value = float(loss.detach())
            correct = int((entry.output.detach().argmax(dim=1) == labels).sum())
        else:
            if grad_output is None or grad_output.shape != entry.output.shape:
                got = None if grad_output is None else tuple(grad_output.shape)
                raise TrainingError(
                    f"gradient of batch {batch_id} has shape {got}, expected {tuple(entry.output.shape)}"
                )
            backward_with(entry.output, grad_output)
        grad_input = None if self.is_first else entry.inputs.grad
        if defer:
            grads = {
                name: t.grad if t.grad is not None else torch.zeros_like(t)
                for name, t in entry.params.items()
            }
            return BackwardResult(grad_input, loss_value, correct, row_loss, row_correct, grads)
        self._apply_update({name: t.grad for name, t in entry.params.items()})
        return BackwardResult(grad_input, loss_value, correct, row_loss, row_correct)

    def apply_gradients(self, grads: dict[str, torch.Tensor]) -> None:
        """Apply one batch's parameter gradients (a replicated stage's sum over its members)."""
        names = {name for name, _ in self.module.named_parameters()}
        if set(grads) != names:
            raise TrainingError(f"gradients for {sorted(grads)}, the stage's parameters are {sorted(names)}")
        self._apply_update(dict(grads))

    def _apply_update(self, used: dict[str, torch.Tensor | None]) -> None:
        if self.optimizer is not None:
            for name, p in self.module.named_parameters():
                p.grad = used[name]
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        self._maybe_aggregate()
        self._stash[self.version] = self._snapshot()
        self._prune()

    def _maybe_aggregate(self) -> None:
        window = self.aggregation_window
        if not self.options.aggregation or window <= 1:
            return
        self._recent.append(self._snapshot())
        del self._recent[:-window]
        if self.version % (window * self.options.aggregation_interval) or len(self._recent) < window:
            return
        # The last `window` versions each grew from the same stale base with different batches;
        # their mean is the aggregated weight (papers/000 Sec. III-C, Fig. 2).
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                p.copy_(torch.stack([v[name] for v in self._recent]).mean(dim=0))
        self._recent = [self._snapshot()]

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor) -> torch.Tensor:
        """Forward with the newest weights in eval mode (test accuracy)."""
        self.module.eval()
        try:
            return self.module(x)
        finally:
            self.module.train()

    # -- weights -------------------------------------------------------------------------------

    def state(self) -> dict[str, torch.Tensor]:
        """Live parameters and buffers, keyed ``layers.<global index>.<name>``."""
        return {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def export(self, layers: Iterable[int]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Weights (parameters and buffers) and momentum buffers of some of this stage's layers."""
        wanted = {str(j) for j in layers}
        missing = wanted - set(self.module.layers.keys())
        if missing:
            raise TrainingError(
                f"layers {sorted(int(j) for j in missing)} are not on this stage "
                f"[{self.module.start}, {self.module.end})"
            )
        weights = {k: v for k, v in self.state().items() if k.split(".")[1] in wanted}
        momentum: dict[str, torch.Tensor] = {}
        if self.optimizer is not None:
            for name, p in self.module.named_parameters():
                buf = self.optimizer.state.get(p, {}).get("momentum_buffer")
                if buf is not None and name.split(".")[1] in wanted:
                    momentum[name] = buf.detach().clone()
        return weights, momentum

    def load_momentum(self, momentum: dict[str, torch.Tensor]) -> None:
        """Restore momentum buffers (moved here with their layers)."""
        if self.optimizer is None:
            return
        for name, p in self.module.named_parameters():
            buf = momentum.get(name)
            if buf is not None:
                if buf.shape != p.shape:
                    raise TrainingError(
                        f"momentum for {name} has shape {tuple(buf.shape)}, expected {tuple(p.shape)}"
                    )
                self.optimizer.state[p]["momentum_buffer"] = buf.clone()

    def named_layers(self) -> Iterator[tuple[int, nn.Module]]:
        for key, layer in self.module.layers.items():
            yield int(key), layer
