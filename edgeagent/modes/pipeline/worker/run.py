"""What a worker knows about the pipeline run it is in, and the rules that only look at that state.

:class:`Run` is plain state (no I/O): the plan (points, worker list, this device's stage), the stage's
data path (a :class:`~edgeagent.pipeline.runner.StageRunner`), the batches waiting here and the 1F1B
bookkeeping. Which incoming batch fits (:meth:`Run.activation_problem`) and what to compute next
(:meth:`Run.ready`) are decided here, so the session (:mod:`.session`) only moves
messages and the rules can be read (and tested) without a broker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from edgeagent.compression.stage import StageCodecs
from edgeagent.models import ModelSpec
from edgeagent.pipeline.runner import StageRunner, log_bound
from edgeagent.pipeline.schedule import Kind, admit, next_kind, stage_bound
from edgeagent.pipeline.stage import Stage
from edgeagent.protocol.commands import Resend
from edgeagent.protocol.limits import TensorMeta
from edgeagent.protocol.messages import Activation, Gradient
from edgeagent.protocol.options import TrainOptions
from edgeagent.replication.period import ChainPoints
from edgeagent.replication.switch import Switch


def stage_input(spec: ModelSpec, start: int, shapes: list[list[int]], dtypes: list[str]) -> TensorMeta | None:
    """One sample of what layer ``start`` takes, from the central node's layer profile (``Assign``):
    the output of layer ``start - 1``. None when the assignment carried no profile: only the batch and
    the labels of incoming activations are then checked."""
    if start == 0:
        return tuple(spec.in_shape), torch.float32  # the data sets are float32
    if len(shapes) < start or len(dtypes) < start:
        return None
    dtype = getattr(torch, dtypes[start - 1], None)
    if not isinstance(dtype, torch.dtype):
        return None
    return tuple(shapes[start - 1]), dtype


@dataclass
class Run:
    """What a worker knows about the run it is in; the plan part changes at every re-partition."""

    run_id: str
    spec: ModelSpec
    seed: int
    options: TrainOptions
    plan_id: int
    points: list[int]
    worker_list: list[str]
    index: int
    runner: StageRunner  # the stage and its data path (pipeline/runner.py)
    subscriptions: list[str] = field(default_factory=list)
    forwards: dict[int, Activation] = field(default_factory=dict)
    backwards: dict[int, Gradient] = field(default_factory=dict)
    evals: list[Activation] = field(default_factory=list)
    next_forward: int = 0
    next_backward: int = 0
    last: Kind | None = None
    batches: int = 0  # backward passes done under this plan
    samples: int = 0  # training samples through this stage in the run (all plans)
    switch: Switch | None = None
    chain_every: int = 50
    # When this stage sends chain replicas (replication.period): every chain_every batches, retuned by the
    # central node's "replication" command (--chain-seconds). Set from chain_every when the run starts.
    chain_points: ChainPoints = field(init=False)
    global_every: int = 100
    replicas: int = 1
    replica_share: float = 0.0  # Assign.replica_share
    batches_per_epoch: int = 0
    batch_size: int = 0  # of the latest training batch here
    run_bits: int = 32  # the central node's choice of activation bits for this stage (a profile may override)
    in_flight: int = 4  # the central node's bound on batches in flight (Assign.in_flight)
    sample: TensorMeta | None = None  # one sample of this stage's input (see stage_input)
    layer_shapes: list[list[int]] = field(default_factory=list)  # Assign.layer_shapes
    layer_dtypes: list[str] = field(default_factory=list)
    # A recovery without a rollback (protocol Resend): the gradients to resend once every batch sent on
    # came back (the stage after a dead one), and whether the central node stands in for the dead stage
    # after this one until the next plan (the stage before it: the replay's gradients come from there).
    resend: Resend | None = None
    stand_in: bool = False

    def __post_init__(self) -> None:
        self.chain_points = ChainPoints(self.chain_every)

    @property
    def stage(self) -> Stage:
        return self.runner.stage

    @property
    def codecs(self) -> StageCodecs:
        return self.runner.codecs

    @property
    def window(self) -> int:
        """How far ahead of ``next_forward`` a legitimate training batch can be: the central node keeps at
        most ``in_flight`` batches in flight, and every stage forwarded each of them before it commits
        one; twice that (or the number of stages, which joiners may raise) and some slack."""
        return 2 * max(self.in_flight, self.num_stages) + 16

    @property
    def num_stages(self) -> int:
        return len(self.points) - 1

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1

    @property
    def eval_window(self) -> int:
        """Evaluation batches that may wait here: the central node streams the test set with at most
        ``max(2, in_flight)`` chunks ahead of their results; twice that (QoS 1 may deliver one twice)."""
        return 2 * max(2, self.in_flight)

    def matches(self, run_id: str, plan_id: int) -> bool:
        return run_id == self.run_id and plan_id == self.plan_id

    def evaluation_problem(self) -> str | None:
        """Why no evaluation can be in progress here now, or None.

        The central node evaluates only with the pipeline drained at an epoch's end (or after the run's
        last batch): every training batch forwarded here has had its backward pass, and the next one
        starts an epoch. Evaluation batches at any other time are not the run's (or are stale): each
        would be computed and forwarded, so they are dropped.
        """
        held = self.next_forward - self.next_backward
        if held > 0:
            return f"{held} training batches are in flight here"
        options = self.options
        batch = options.batch_of(self.next_forward)
        per, total = self.batches_per_epoch, options.total_batches
        at_end = self.next_forward == options.first_item(batch) and (
            per <= 0 or batch % per == 0 or batch == total
        )
        if not at_end:
            return f"training is at batch {batch} here, not at an epoch's end"
        return None

    def activation_problem(self, msg: Activation) -> str | None:
        """Why an activation of the current run and plan cannot be taken here, or None.

        Checked on receipt: a batch that does not fit would make the forward pass raise (or, kept until
        then, take the place of the legitimate batch of the same id).
        """
        if msg.stage != self.index - 1:
            return f"it comes from stage {msg.stage}, this stage takes stage {self.index - 1}'s"
        if msg.mode == "eval":
            if msg.batch_id < 0:
                return "negative batch id"
            outside = self.evaluation_problem()
            if outside is not None:
                return f"an evaluation batch while no evaluation can be in progress: {outside}"
            if len(self.evals) >= self.eval_window:
                return f"{len(self.evals)} evaluation batches already wait here (at most {self.eval_window})"
        elif msg.batch_id >= self.next_forward + self.window:
            return (
                f"more than {self.window} batches ahead of the next one here ({self.next_forward}); "
                "no such batch can be in flight"
            )
        return None  # the tensors are checked by the stage's runner (after decompression)

    def ready(self) -> Kind | None:
        """The training pass to run next here by 1F1B's rules (a forward or a backward), if any."""
        if self.switch is not None:
            return None  # drained for a re-partition; nothing should arrive, and nothing runs
        held = self.next_forward - self.next_backward  # batches forwarded here whose backward is due
        fwd = self.next_forward in self.forwards and (
            self.is_last or admit(held, stage_bound(self.in_flight, self.index))
        )
        bwd = (not self.is_last) and self.next_backward in self.backwards
        return next_kind(self.last, fwd, bwd)

    def adopt(self, switch: Switch, stage: Stage) -> None:
        """Commit a re-partition: ``switch``'s plan and ``stage`` (built from it) replace the old ones,
        nothing stays queued, and the batch ids go on from the version the switch names. The codecs
        stay until the central node names the new ones; the samples through this device in the run
        stay too."""
        order = switch.order
        self.plan_id, self.points, self.worker_list = (
            order.plan_id,
            list(order.points),
            list(order.worker_list),
        )
        self.index, self.switch = switch.plan.stage, None
        self.in_flight = order.in_flight or self.in_flight
        self.chain_every = order.chain_every or self.chain_every
        self.chain_points = ChainPoints(self.chain_every)
        # A new stage, a new data path (its log starts empty: the old layout's batches cannot be replayed).
        keep = log_bound(self.chain_every, self.in_flight) if self.runner.log_keep else 0
        self.runner = StageRunner(stage, self.index, codecs=self.codecs, log_keep=keep)
        self.forwards.clear()
        self.backwards.clear()
        self.evals.clear()
        self.resend, self.stand_in = None, False
        self.next_forward = self.next_backward = self.options.first_item(order.version)
        self.last, self.batches = None, 0
