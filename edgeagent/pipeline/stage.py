"""One pipeline stage's compute: forward and backward of single batches with weight stashing.

Note: weight stashing and vertical sync.
    ``version`` counts the optimizer updates a stage has applied. The central node tags each batch
    with its own version when it forwards it; every later stage forwards that batch with *its*
    weights of the same version (vertical sync, papers/000 Sec. III-C), and its backward pass uses
    exactly those weights (weight stashing). Stages apply updates in batch order, so a later stage
    always already has the version a batch asks for; it keeps every version a batch in flight or a
    future batch can still ask for, as separate tensors. Forward passes run on detached leaves of
    those stashed tensors, as ``torch.func.functional_call`` runs them, so the optimizer can update the
    live parameters in place without tripping autograd's version counters (the bug that froze PipeDream
    at PyTorch 1.4). The stage swaps them in itself, as ``functional_call`` does (the module's
    ``_parameters`` entries, every alias of a tied one, swapped for the call and back), from places
    worked out once: ``functional_call`` finds them again on every call, about 15 us per forward of a
    two-layer stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edgeagent.errors import TrainingError
from edgeagent.pipeline import audit
from edgeagent.pipeline.backward import backward_with
from edgeagent.pipeline.sgd import SGD, rate_factor
from edgeagent.pipeline.staleness import forward_version, predicted, step_rule
from edgeagent.protocol.options import TrainOptions


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


_Place = tuple[nn.Module, str, str]  # a submodule, its parameter's local name, the parameter's full name


def _places(module: nn.Module, named: list[tuple[str, nn.Parameter]]) -> list[_Place]:
    """Where every parameter of ``named`` sits in ``module``: each submodule entry that holds it (a tied
    parameter sits in several, and ``functional_call`` replaces it in all of them)."""
    name_of = {id(p): name for name, p in named}
    places: list[_Place] = []
    for sub in module.modules(remove_duplicate=False):
        for local, p in sub._parameters.items():
            if p is not None and id(p) in name_of:
                places.append((sub, local, name_of[id(p)]))
    return places


def _call_with(
    module: nn.Module, places: list[_Place], params: dict[str, torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    """``functional_call(module, params, (x,))``: ``module(x)`` with ``params`` in place of its parameters
    (the same tensors in the same ``_parameters`` entries, so the same arithmetic), restored after."""
    originals = [sub._parameters[local] for sub, local, _ in places]
    try:
        for sub, local, name in places:
            sub._parameters[local] = params[name]  # type: ignore[assignment]
        return module(x)
    finally:
        for (sub, local, _), original in zip(places, originals, strict=True):
            sub._parameters[local] = original


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
        delay: int = 0,
        depth: int = 1,
    ) -> None:
        self.module = module
        self.options = options
        # Versions concurrently used on this stage: n - i for stage i of n (papers/000 Sec. III-C).
        self.aggregation_window = aggregation_window
        self.is_first = is_first
        self.is_last = is_last
        self.version = version
        self.base = version  # no version before this one was ever here (a rebuilt stage starts anew)
        # The compensation of this stage's delay (pipeline.staleness): its step and its forward's version.
        self.depth = max(1, depth)
        # Named once: module.named_parameters() walks every submodule (a MobileNetV2 stage's are deep), and
        # the stash, the momentum snapshots and every update loop over them per batch.
        self._named = list(module.named_parameters())
        self._params = [p for _, p in self._named]
        self._places = _places(module, self._named)
        self._training = False  # whether the module is known to be in train mode (evaluate leaves it so)
        self.delay = 0
        self.optimizer: SGD | None = None
        self.set_delay(delay)
        self._stash: dict[int, dict[str, torch.Tensor]] = {version: self._snapshot()}
        # The momentum buffers of every stashed version, where the forward predicts from them.
        self._momenta: dict[int, dict[str, torch.Tensor]] = {}
        if self.rule.predict:
            self._momenta[version] = self._momentum_snapshot()
        self._in_flight: dict[int, _InFlight] = {}
        self._floor = version  # no future batch asks for a version below this
        self._recent: list[dict[str, torch.Tensor]] = []  # last versions, for aggregation
        # PipeDream-2BW: the gradients of the window so far (summed) and how many batches they are.
        self._window_grads: dict[str, torch.Tensor] = {}
        self._window_count = 0
        # The synchronous schedule: the parameter gradients of the batch's micro-batches so far (summed).
        self._micro_grads: dict[str, torch.Tensor] = {}
        # Hybrid stages: the version of every batch not yet updated here, kept stashed so the batch can
        # be computed again (a replica of the stage died with some of its rows).
        self._pinned: dict[int, int] = {}
        # This copy's id in the audit log (pipeline/audit.py; build.make_stage sets it): None when it is off.
        self.audit_copy: int | None = None

    def _rate_factor(self, step: int) -> float:
        options = self.options
        return rate_factor(
            options.lr_schedule, step, options.total_batches, options.lr_steps, options.lr_gamma
        )

    def set_delay(self, delay: int) -> None:
        """This stage is ``delay`` updates stale (``staleness.stage_delay``): its step rule follows; the
        momentum buffers stay. The synchronous schedule is never stale: plain SGD."""
        options = self.options
        self.delay = 0 if options.micro_batches else max(0, delay)
        self.rule = step_rule(
            "none" if options.micro_batches else options.staleness,
            learning_rate=options.learning_rate,
            momentum=options.momentum,
            weight_decay=options.weight_decay,
            delay=self.delay,
            depth=1 if options.micro_batches else self.depth,
        )
        if self.optimizer is None:
            self.optimizer = SGD(self._params, self.rule) if self._params else None
        else:
            state = self.optimizer.state
            self.optimizer = SGD(self._params, self.rule)
            self.optimizer.state = state

    # -- bookkeeping -----------------------------------------------------------------------------

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self._named}

    def _momentum_snapshot(self) -> dict[str, torch.Tensor]:
        if self.optimizer is None:
            return {}
        out: dict[str, torch.Tensor] = {}
        for name, p in self._named:
            buf = self.optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                out[name] = buf.detach().clone()
        return out

    @property
    def stashed_versions(self) -> list[int]:
        return sorted(self._stash)

    def has_version(self, version: int) -> bool:
        """Whether weight version ``version`` is stashed here (a forward may ask for it)."""
        return version in self._stash

    def version_for(self, batch_id: int, asked: int | None = None) -> int:
        """The version :meth:`forward` takes for ``batch_id`` (``asked``: the one its message names)."""
        if self.options.micro_batches:
            return self.version if asked is None else asked  # the batch's: nothing is stale
        return forward_version(
            self.options.staleness,
            batch_id,
            asked=asked,
            base=self.base,
            newest=self.version,
            delay=self.delay,
            window=self.depth,
        )

    @property
    def in_flight(self) -> list[int]:
        return sorted(self._in_flight)

    def _prune(self) -> None:
        floor = self._floor
        if all(version >= floor for version in self._stash):
            return  # nothing below the floor, nothing to drop (at most one of the calls per batch drops)
        keep = {v.version for v in self._in_flight.values()} | {self.version} | set(self._pinned.values())
        for version in list(self._stash):
            if version < self._floor and version not in keep:
                del self._stash[version]
                self._momenta.pop(version, None)

    def drop_in_flight(self) -> None:
        """Forget batches in flight (after a fault or a re-split); their updates never happen."""
        self._in_flight.clear()
        self._pinned.clear()
        self._micro_grads = {}
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
        """Forward a training batch; ``version`` is the one its message names (``None`` on stage 0).

        The version used follows the staleness rule (:meth:`version_for`): the named one under vertical
        sync, else the stage's own delay; a predicting rule forwards the weights predicted from it for
        the batch's update. Returns the output (detached, to send on) and the version used.
        """
        version = self.version_for(batch_id, version)
        if version not in self._stash:
            raise TrainingError(
                f"batch {batch_id} asks for weight version {version}, stashed: {self.stashed_versions}"
            )
        if batch_id in self._in_flight:
            raise TrainingError(f"batch {batch_id} forwarded twice")
        self._floor = max(self._floor, version)
        weights = self._stash[version]
        if self.rule.predict and batch_id > version:
            factor = self._rate_factor(version)
            # lr * 1.0 is lr exactly: the constant schedule predicts with the stage's own rule.
            rule = (
                self.rule
                if factor == 1.0
                else dataclasses.replace(self.rule, learning_rate=self.rule.learning_rate * factor)
            )
            weights = predicted(weights, self._momenta.get(version, {}), rule, batch_id - version)
        params = {name: t.detach().requires_grad_(True) for name, t in weights.items()}
        inputs = x if self.is_first else x.detach().requires_grad_(True)
        if not self._training:  # train mode once, not a walk over the modules per batch
            self.module.train()
            self._training = True
        output = _call_with(self.module, self._places, params, inputs)  # (B, ...)
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
        if self.options.micro_batches:
            self._micro_batch_done(batch_id, entry.params)
        else:
            self._apply_update({name: t.grad for name, t in entry.params.items()}, batch=batch_id)
        return BackwardResult(grad_input, loss_value, correct, row_loss, row_correct)

    def _micro_batch_done(self, item: int, params: dict[str, torch.Tensor]) -> None:
        """The synchronous schedule: add a micro-batch's gradients to its batch's (each micro-batch's loss
        is over the whole batch's rows, so they add up to the batch's gradient); the last one applies them."""
        for name, t in params.items():
            if t.grad is None:
                continue
            acc = self._micro_grads.get(name)
            self._micro_grads[name] = t.grad if acc is None else acc.add_(t.grad)
        if (item + 1) % self.options.micro_batches:
            return
        summed, self._micro_grads = self._micro_grads, {}
        self._apply_update({name: summed.get(name) for name in params}, batch=self.options.batch_of(item))

    def micro_pending(self) -> bool:
        """Whether some micro-batches of a batch have been backwarded here and its update is still due."""
        return bool(self._micro_grads)

    def apply_gradients(self, grads: dict[str, torch.Tensor]) -> None:
        """Apply one batch's parameter gradients (a replicated stage's sum over its members)."""
        names = {name for name, _ in self._named}
        if set(grads) != names:
            raise TrainingError(f"gradients for {sorted(grads)}, the stage's parameters are {sorted(names)}")
        self._apply_update(dict(grads))

    def _apply_update(self, used: dict[str, torch.Tensor | None], *, batch: int | None = None) -> None:
        """Apply one batch's update (``batch``: its id, for the audit log; a replicated stage's sum names
        none: the version it is applied at stands for it)."""
        if self.options.staleness == "2bw":
            used = self._windowed(used)
        if self.optimizer is not None and used:
            for name, p in self._named:
                p.grad = used[name]
            self.optimizer.lr = self.rule.learning_rate * self._rate_factor(self.version)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        if self.audit_copy is not None:  # once applied: a line in the log is an update in the weights
            before = self.version - 1
            audit.applied(self.audit_copy, before if batch is None else batch, before)
        self._maybe_aggregate()
        self._stash[self.version] = self._snapshot()
        if self.rule.predict:
            self._momenta[self.version] = self._momentum_snapshot()
        self._prune()

    def _windowed(self, grads: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        """PipeDream-2BW: add this batch's gradients to its window's; at the window's last batch, their
        mean (the update), else nothing (the weights stay; the version still counts the batch). A stage
        rebuilt mid-window (a re-split, a recovery) averages the batches it saw."""
        for name, g in grads.items():
            if g is None:
                continue
            acc = self._window_grads.get(name)
            self._window_grads[name] = g.detach().clone() if acc is None else acc.add_(g)
        self._window_count += 1
        if (self.version + 1) % self.depth:
            return {}
        count, summed = self._window_count, self._window_grads
        self._window_grads, self._window_count = {}, 0
        return {name: (summed[name] / count if name in summed else None) for name in grads}

    def _maybe_aggregate(self) -> None:
        window = self.aggregation_window
        if self.options.staleness != "aggregate" or window <= 1:
            return
        self._recent.append(self._snapshot())
        del self._recent[:-window]
        if self.version % (window * self.options.aggregation_interval) or len(self._recent) < window:
            return
        # The last `window` versions each grew from the same stale base with different batches;
        # their mean is the aggregated weight (papers/000 Sec. III-C, Fig. 2).
        with torch.no_grad():
            for name, p in self._named:
                p.copy_(torch.stack([v[name] for v in self._recent]).mean(dim=0))
        self._recent = [self._snapshot()]

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor) -> torch.Tensor:
        """Forward with the newest weights in eval mode (test accuracy)."""
        self._training = False
        self.module.eval()
        try:
            return self.module(x)
        finally:
            self.module.train()
            self._training = True

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
            for name, p in self._named:
                buf = self.optimizer.state.get(p, {}).get("momentum_buffer")
                if buf is not None and name.split(".")[1] in wanted:
                    momentum[name] = buf.detach().clone()
        return weights, momentum

    def load_momentum(self, momentum: dict[str, torch.Tensor]) -> None:
        """Restore momentum buffers (moved here with their layers)."""
        if self.optimizer is None:
            return
        for name, p in self._named:
            buf = momentum.get(name)
            if buf is not None:
                if buf.shape != p.shape:
                    raise TrainingError(
                        f"momentum for {name} has shape {tuple(buf.shape)}, expected {tuple(p.shape)}"
                    )
                self.optimizer.state[p]["momentum_buffer"] = buf.clone()
        if self.rule.predict:
            self._momenta[self.version] = self._momentum_snapshot()

    def named_layers(self) -> Iterator[tuple[int, nn.Module]]:
        for key, layer in self.module.layers.items():
            yield int(key), layer
