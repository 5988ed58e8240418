"""Pipelining overlap, and edgeagent against the pipeline a user would pick instead.

    python bench/pipeline.py [--slowdown 10] [--batches 90] [--in-flight K] [--broker URL]
                             [--compare-batches 300] [--repeats 3] [--microbatches 3]
                             [--schedule 1f1b|gpipe] [--baseline torch|sockets] [--timeout 120]
                             [--skip-overlap] [--skip-compare] [--json FILE]

Part 1, overlap: samples/s of a 3-device pipeline with the in-flight bound at its default and at 1.
Compute dominates through ``--slowdowns S,S,S`` (each device takes S times its CPU time, sleeping the
difference, so three emulated devices do not fight over two cores). With three equal stages the
ratio approaches 3: stage 0 keeps three batches in flight and every device is busy.

Part 2, the peer: the same model (the default ``mlp``, six layers, seed 0), the same split (edgeagent
with ``--partition uniform``; each torch run takes ``report.partitions[0]["points"]`` of the edgeagent
run it is paired with, since the uniform split balances profiled layer times and can differ between
runs), the same data
(digits, the same batches in the same order), batch 32, SGD lr 0.05 momentum 0.5 weight decay 4e-5
and one torch thread per process, trained by edgeagent (``run_demo``: embedded broker, central +
2 workers) and by ``torch.distributed.pipelining`` (``Schedule1F1B``, or ``ScheduleGPipe``, over
gloo on loopback, one process per stage), with equal stages and with the third stage 4x slower.
Samples/s = samples trained / wall time of the training loop; process start-up, edgeagent's
profiling and link probes, torch's first (shape-inferring, untimed) step and evaluation are left
out. Each figure is the median of ``--repeats`` runs.

How the set-ups differ (by design: this is what a user chooses between):

* Transport: edgeagent sends every activation and gradient through an MQTT broker at QoS 1, so each
  transfer is 4 hops (PUBLISH sender -> broker, PUBACK back, PUBLISH broker -> receiver, PUBACK
  back; the tensor crosses loopback twice, store-and-forward) plus the envelope, the codec and the
  message checks; torch's gloo sends the tensor once over a direct TCP connection between the ranks.
* Schedule: edgeagent is asynchronous 1F1B with weight stashing: stage 0 keeps K batches (K = 3,
  the number of stages) in flight across optimizer steps, so the pipeline never drains and every
  batch of 32 is one update (with stale weights, PipeDream's rule). torch's schedules are
  synchronous per step: a step of ``--microbatches`` M micro-batches of 32 (M = 3 by default, the
  same work in flight as edgeagent's K) fills the pipeline, drains it, and makes one update of the
  averaged gradient, so every step pays the fill-and-drain bubble ((n - 1) / (M + n - 1) of the
  time for n equal stages). Both process the same 32-sample tensors per transfer and the same
  number of samples in all.
* Extras edgeagent runs and torch does not: heartbeats, metrics, chain and global weight
  replication (every 50 / 100 batches), the batch timer, and the per-message validation.
* Slowdown emulation is the same in both: after each forward and each backward of the slow stage,
  sleep until the step has taken F times the CPU time it really used (edgeagent's
  ``emulate_slowdown``, which on the last stage times forward and backward as one step; in torch a
  wrapper module with two autograd markers times the backward).

If torch's schedule fails or hangs on gloo/CPU (``--timeout`` per run), the script says so with the
error and compares against a plain synchronous pipeline over direct TCP sockets instead (one process
per stage, GPipe fill-and-drain over M micro-batches per step, forward activations and backward
gradients as raw float32 over the sockets); ``--baseline sockets`` picks that baseline outright.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import multiprocessing as mp
import os
import queue
import socket
import statistics
import struct
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from torch import nn

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.data import Dataset, batch_indices, batches_per_epoch, load_dataset
from edgeagent.models import ModelSpec, build_model
from edgeagent.ops.logs import setup_logging
from edgeagent.pipeline.schedule import one_f_one_b, simulate
from edgeagent.runtime.compute import Clock, emulate_slowdown

# Part 1: six 1024-wide layers and a small head split 2/2/2+head: three equal stages whose cost is
# real matrix work, not per-call overhead.
MODEL_OPTIONS = {"hidden": [1024] * 6}

# Part 2: what both sides train.
DATASET = "digits"
BATCH_SIZE = 32
LEARNING_RATE = 0.05
MOMENTUM = 0.5
WEIGHT_DECAY = 4e-5
SEED = 0
SETUPS: dict[str, list[float]] = {"equal stages (1,1,1)": [1.0, 1.0, 1.0], "slowdowns 1,1,4": [1.0, 1.0, 4.0]}

Baseline = Literal["torch", "sockets"]


# -- part 1: overlap -------------------------------------------------------------------------------


def measure(in_flight: int, *, slowdown: float, batches: int, broker: str | None) -> dict[str, Any]:
    train = TrainConfig(
        model="mlp",
        model_options=MODEL_OPTIONS,
        dataset="synthetic:8192:1024:10",
        batch_size=64,
        epochs=1,
        max_batches=batches,
        in_flight=in_flight,
        learning_rate=0.01,
    )
    config = CentralConfig(train=train, progress=False)
    report = run_demo(config, workers=2, slowdowns=[slowdown] * 3, broker=broker, show_progress=False)
    return {
        "in_flight": report.in_flight,
        "samples_per_second": report.samples_per_second,
        "train_seconds": report.train_seconds,
        "points": report.partitions[-1]["points"],
    }


def overlap(args: argparse.Namespace) -> dict[str, Any]:
    pipelined = measure(args.in_flight, slowdown=args.slowdown, batches=args.batches, broker=args.broker)
    serial = measure(1, slowdown=args.slowdown, batches=args.batches, broker=args.broker)
    ratio = pipelined["samples_per_second"] / serial["samples_per_second"]
    ideal = (
        simulate(one_f_one_b(3, args.batches, 1), [1] * 3, [2] * 3).makespan
        / simulate(one_f_one_b(3, args.batches, 3), [1] * 3, [2] * 3).makespan
    )
    print(
        f"3-device pipeline, mlp 6x1024+head on synthetic 1024-feature data, batch 64, "
        f"slowdowns {args.slowdown:g} everywhere, {args.batches} batches, partition {pipelined['points']}"
    )
    print(f"{'in-flight bound':<28}{'samples/s':>12}{'train s':>10}")
    print(
        f"{'default (' + str(pipelined['in_flight']) + ', pipelined)':<28}"
        f"{pipelined['samples_per_second']:>12.1f}{pipelined['train_seconds']:>10.2f}"
    )
    print(f"{'1 (no pipelining)':<28}{serial['samples_per_second']:>12.1f}{serial['train_seconds']:>10.2f}")
    print(f"overlap ratio: {ratio:.2f}x  (ideal for three equal stages with fill and drain: {ideal:.2f}x)")
    return {"pipelined": pipelined, "serial": serial, "ratio": ratio}


# -- part 2: edgeagent ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EdgeRun:
    samples_per_second: float
    train_seconds: float
    batches: int
    points: list[int]
    final_loss: float


def edgeagent_run(slowdowns: list[float], *, batches: int, broker: str | None) -> EdgeRun:
    """Train the default mlp on digits with edgeagent (uniform split, so the points never move)."""
    data = load_dataset(DATASET, seed=SEED)
    per_epoch = batches_per_epoch(data.x_train.shape[0], BATCH_SIZE)
    train = TrainConfig(
        model="mlp",
        dataset=DATASET,
        batch_size=BATCH_SIZE,
        epochs=math.ceil(batches / per_epoch),
        max_batches=batches,
        learning_rate=LEARNING_RATE,
        momentum=MOMENTUM,
        weight_decay=WEIGHT_DECAY,
        seed=SEED,
    )
    config = CentralConfig(train=train, progress=False, partition="uniform")
    report = run_demo(
        config, workers=len(slowdowns) - 1, slowdowns=slowdowns, broker=broker, show_progress=False
    )
    tail = [float(t["loss"]) for t in report.timeline[-10:]]
    return EdgeRun(
        samples_per_second=report.samples_per_second,
        train_seconds=report.train_seconds,
        batches=report.batches,
        points=list(report.partitions[0]["points"]),
        final_loss=statistics.fmean(tail) if tail else float("nan"),
    )


# -- part 2: the peer, one process per stage -----------------------------------------------------


class _Mark:
    """When the backward of one micro-batch started on the slow stage."""

    __slots__ = ("clock",)

    def __init__(self) -> None:
        self.clock = Clock()


class _BackwardStarts(torch.autograd.Function):
    """Identity on the stage's output; its backward runs first in the stage: start the clock."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mark: _Mark) -> torch.Tensor:
        ctx.mark = mark
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.mark.clock = Clock()
        return grad, None


class _BackwardEnds(torch.autograd.Function):
    """Identity on the stage's input; its backward runs last in the stage: stretch the step.

    ``anchor`` requires grad so that the marker runs even on stage 0, whose input does not.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, anchor: torch.Tensor, mark: _Mark, factor: float) -> torch.Tensor:
        ctx.mark, ctx.factor = mark, factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        emulate_slowdown(ctx.mark.clock, ctx.factor)
        return grad, None, None, None


class Slowed(nn.Module):
    """``inner`` made ``factor`` times slower the way edgeagent's ``--slowdown`` does it.

    After each forward and each backward, sleep until the step has taken ``factor`` times the CPU time
    it used (``edgeagent.runtime.compute.emulate_slowdown``). The backward of one micro-batch runs whole
    before the next one's starts (one thread per process), so one mark per forward suffices.
    """

    def __init__(self, inner: nn.Module, factor: float) -> None:
        super().__init__()
        self.inner = inner
        self.factor = factor
        # Not a parameter: the optimizer never sees it, and it never gets a gradient.
        self.anchor = torch.zeros((), requires_grad=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        started = Clock()
        mark = _Mark()
        x = _BackwardEnds.apply(x, self.anchor, mark, self.factor)
        out = self.inner(x)
        emulate_slowdown(started, self.factor)
        return _BackwardStarts.apply(out, mark)


@dataclass(frozen=True)
class PeerConfig:
    """What every stage process of the peer shares for the whole benchmark; picklable for ``spawn``."""

    num_stages: int
    baseline: Baseline
    schedule: str
    microbatches: int
    batches: int
    ports: list[int]
    timeout: float


@dataclass(frozen=True)
class PeerJob:
    """One training run: the split (edgeagent's, of the paired run) and each stage's slowdown."""

    points: list[int]
    slowdowns: list[float]


@dataclass
class StageResult:
    rank: int
    ready: bool = False
    seconds: float = 0.0
    samples: int = 0
    final_loss: float = float("nan")
    error: str = ""


def _stage_module(job: PeerJob, rank: int, in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Layers ``points[rank]:points[rank + 1]`` of the same seeded model edgeagent builds."""
    model = build_model(ModelSpec("mlp", in_shape, num_classes), seed=SEED)
    start, end = job.points[rank], job.points[rank + 1]
    module: nn.Module = nn.Sequential(*list(model)[start:end])
    factor = job.slowdowns[rank]
    return Slowed(module, factor) if factor > 1.0 else module


def peer_steps(data: Dataset, microbatches: int, batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Step ``i`` holds edgeagent's batches ``i*M .. i*M+M-1`` (same samples, same order), concatenated.

    One more step than ``batches / M`` is made: the first one is run untimed.
    """
    n = data.x_train.shape[0]
    per_epoch = batches_per_epoch(n, BATCH_SIZE)
    orders: dict[int, list[torch.Tensor]] = {}

    def indices(b: int) -> torch.Tensor:
        epoch, i = divmod(b, per_epoch)
        if epoch not in orders:
            orders[epoch] = batch_indices(n, BATCH_SIZE, epoch=epoch, seed=SEED)
        return orders[epoch][i]

    m = microbatches
    steps = []
    for s in range(math.ceil(batches / m) + 1):
        idx = torch.cat([indices(s * m + k) for k in range(m)])  # (M * 32,)
        steps.append((data.x_train[idx], data.y_train[idx]))
    return steps


def _optimizer(module: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        module.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY
    )


def _torch_run(
    config: PeerConfig, rank: int, module: nn.Module, steps: list[tuple[torch.Tensor, torch.Tensor]]
) -> StageResult:
    """One run on one rank of ``torch.distributed.pipelining`` (the process group is up)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    n = config.num_stages
    stage = PipelineStage(module, rank, n, torch.device("cpu"))
    kind = Schedule1F1B if config.schedule == "1f1b" else ScheduleGPipe
    schedule = kind(stage, n_microbatches=config.microbatches, loss_fn=nn.functional.cross_entropy)
    optimizer = _optimizer(module)
    losses: list[torch.Tensor] = []

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        losses.clear()
        if rank == 0:
            schedule.step(x)
        elif rank == n - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    dist.barrier()
    step(*steps[0])  # shape inference: start-up, untimed
    dist.barrier()
    started = time.perf_counter()
    for x, y in steps[1:]:
        step(x, y)
    dist.barrier()
    seconds = time.perf_counter() - started
    loss = statistics.fmean(v.item() for v in losses) if losses else float("nan")
    samples = (len(steps) - 1) * config.microbatches * BATCH_SIZE
    return StageResult(rank, seconds=seconds, samples=samples, final_loss=loss)


# The sockets baseline: a tensor is a header (ndim, then each dim) and raw float32 bytes.
_NDIM = struct.Struct("!I")
_DIM = struct.Struct("!Q")


def _recv_exact(conn: socket.socket, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = conn.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionError(f"peer closed after {got} of {size} bytes")
        got += n
    return buf


def send_tensor(conn: socket.socket, t: torch.Tensor) -> None:
    """Write ``t`` (float32) as its shape and raw bytes."""
    t = t.detach().to(torch.float32).contiguous()
    head = _NDIM.pack(t.dim()) + b"".join(_DIM.pack(d) for d in t.shape)
    conn.sendall(head + t.numpy().tobytes())


def recv_tensor(conn: socket.socket) -> torch.Tensor:
    """Read one tensor written by :func:`send_tensor`."""
    (ndim,) = _NDIM.unpack(_recv_exact(conn, _NDIM.size))
    shape = [int(_DIM.unpack(_recv_exact(conn, _DIM.size))[0]) for _ in range(ndim)]
    raw = _recv_exact(conn, 4 * math.prod(shape))
    return torch.frombuffer(raw, dtype=torch.float32).reshape(shape)


@dataclass
class Chain:
    """A stage's sockets to its neighbours (None at the ends)."""

    prev: socket.socket | None
    next: socket.socket | None

    @classmethod
    def connect(cls, config: PeerConfig, rank: int) -> Chain:
        """Rank r listens on ``ports[r - 1]`` for rank r - 1 and connects to rank r + 1 on ``ports[r]``."""
        prev = nxt = None
        deadline = time.monotonic() + config.timeout
        server = None
        if rank > 0:
            server = socket.create_server(("127.0.0.1", config.ports[rank - 1]))
            server.settimeout(config.timeout)
        while rank < config.num_stages - 1 and nxt is None:
            try:
                nxt = socket.create_connection(("127.0.0.1", config.ports[rank]), timeout=config.timeout)
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        if server is not None:
            prev, _ = server.accept()
            server.close()
        for conn in (prev, nxt):
            if conn is not None:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.settimeout(config.timeout)
        return cls(prev, nxt)

    def close(self) -> None:
        for conn in (self.prev, self.next):
            if conn is not None:
                conn.close()


def _socket_run(
    config: PeerConfig,
    rank: int,
    chain: Chain,
    module: nn.Module,
    steps: list[tuple[torch.Tensor, torch.Tensor]],
) -> StageResult:
    """One run on one rank of a plain synchronous pipeline: GPipe fill-and-drain over TCP sockets."""
    first, last = rank == 0, rank == config.num_stages - 1
    optimizer = _optimizer(module)
    m = config.microbatches

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        xs, ys = x.chunk(m), y.chunk(m)
        inputs: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []
        for k in range(m):  # fill: every micro-batch forward
            if first:
                inp = xs[k]
            else:
                assert chain.prev is not None
                inp = recv_tensor(chain.prev).requires_grad_()
            out = module(inp)
            if last:
                # Mean over the micro-batches, as torch's schedules scale the gradients.
                out = nn.functional.cross_entropy(out, ys[k]) / m
            else:
                assert chain.next is not None
                send_tensor(chain.next, out)
            inputs.append(inp)
            outputs.append(out)
        total = 0.0
        for k in range(m):  # drain: every micro-batch backward
            if last:
                outputs[k].backward()
                total += outputs[k].item()
            else:
                assert chain.next is not None
                outputs[k].backward(recv_tensor(chain.next))
            if not first:
                grad = inputs[k].grad
                assert grad is not None and chain.prev is not None
                send_tensor(chain.prev, grad)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total

    step(*steps[0])  # untimed, as on the torch side; it also waits for every stage to be ready
    # Rank 0 ends every step (its backward is the drain's last), so its clock spans the run.
    started = time.perf_counter()
    loss = float("nan")
    for x, y in steps[1:]:
        loss = step(x, y)
    seconds = time.perf_counter() - started
    samples = (len(steps) - 1) * m * BATCH_SIZE
    return StageResult(rank, seconds=seconds, samples=samples, final_loss=loss)


def _stage_main(config: PeerConfig, rank: int, commands: Any, results: Any) -> None:
    """A stage process: set up the transport once, then train one run per :class:`PeerJob` received."""
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    logging.getLogger("torch.distributed.pipelining").setLevel(logging.ERROR)
    chain = None
    try:
        if config.baseline == "torch":
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{config.ports[0]}",
                rank=rank,
                world_size=config.num_stages,
                timeout=timedelta(seconds=config.timeout),
            )
        else:
            chain = Chain.connect(config, rank)
        data = load_dataset(DATASET, seed=SEED)
        steps = peer_steps(data, config.microbatches, config.batches)
        results.put(StageResult(rank, ready=True))
        while (job := commands.get()) is not None:
            module = _stage_module(job, rank, data.in_shape, data.num_classes)
            if chain is None:
                results.put(_torch_run(config, rank, module, steps))
            else:
                results.put(_socket_run(config, rank, chain, module, steps))
    except BaseException as exc:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        results.put(StageResult(rank, error=f"rank {rank}: {detail}"))
    finally:
        if chain is not None:
            chain.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class PeerRun:
    samples_per_second: float
    seconds: float
    samples: int
    final_loss: float
    points: list[int]


class PeerFailed(RuntimeError):
    """The peer's pipeline failed or did not answer within the timeout."""


class PeerPool:
    """One process per stage, started once (torch's import and the process group are start-up, not
    training) and handed one :class:`PeerJob` per run; idle while edgeagent runs."""

    def __init__(self, config: PeerConfig) -> None:
        self.config = config
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._commands = [ctx.Queue() for _ in range(config.num_stages)]
        self._procs = [
            ctx.Process(
                target=_stage_main, args=(config, rank, self._commands[rank], self._results), daemon=True
            )
            for rank in range(config.num_stages)
        ]
        self.startup_seconds = 0.0

    def __enter__(self) -> PeerPool:
        started = time.perf_counter()
        for proc in self._procs:
            proc.start()
        try:
            self._collect("start-up")
        except BaseException:
            self.close()
            raise
        self.startup_seconds = time.perf_counter() - started
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _collect(self, what: str) -> dict[int, StageResult]:
        got: dict[int, StageResult] = {}
        deadline = time.monotonic() + self.config.timeout
        while len(got) < self.config.num_stages:
            try:
                r = self._results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                missing = sorted(set(range(self.config.num_stages)) - set(got))
                raise PeerFailed(
                    f"{what}: no answer from ranks {missing} within {self.config.timeout:g} s (hung)"
                ) from None
            if r.error:
                raise PeerFailed(f"{what}: {r.error}")
            got[r.rank] = r
        return got

    def run(self, job: PeerJob) -> PeerRun:
        """Train one run; raise :class:`PeerFailed` on an error or a hang."""
        for commands in self._commands:
            commands.put(job)
        got = self._collect(f"run with slowdowns {job.slowdowns}")
        # The loop's wall time is the slowest rank's.
        seconds = max(r.seconds for r in got.values())
        samples = got[0].samples
        return PeerRun(
            samples / seconds, seconds, samples, got[self.config.num_stages - 1].final_loss, job.points
        )

    def close(self) -> None:
        for commands in self._commands:
            with contextlib.suppress(ValueError, OSError):
                commands.put(None)
        for proc in self._procs:
            if proc.pid is None:
                continue
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()  # our own child, by its handle
                proc.join()


# -- part 2: the comparison --------------------------------------------------------------------


def compare(args: argparse.Namespace) -> dict[str, Any]:
    schedule_name = "Schedule1F1B" if args.schedule == "1f1b" else "ScheduleGPipe"
    n = len(next(iter(SETUPS.values())))

    def config(baseline: Baseline) -> PeerConfig:
        return PeerConfig(
            num_stages=n,
            baseline=baseline,
            schedule=args.schedule,
            microbatches=args.microbatches,
            batches=args.compare_batches,
            ports=[_free_port() for _ in range(max(1, n - 1))],
            timeout=args.timeout,
        )

    edge: dict[str, list[EdgeRun]] = {name: [] for name in SETUPS}
    jobs: dict[str, list[PeerJob]] = {name: [] for name in SETUPS}
    peer: dict[str, list[PeerRun]] = {name: [] for name in SETUPS}
    failure = ""
    baseline: Baseline = args.baseline
    with contextlib.ExitStack() as stack:
        pool: PeerPool | None = None
        if baseline == "torch":
            try:
                pool = stack.enter_context(PeerPool(config("torch")))
            except PeerFailed as exc:
                failure = str(exc)
        for _ in range(args.repeats):
            for name, slowdowns in SETUPS.items():
                # Paired runs, one after the other: the load of the shared machine hits both alike. The
                # uniform split balances profiled layer times, so it can differ between runs: the peer
                # takes the split of the edgeagent run it is paired with.
                e = edgeagent_run(slowdowns, batches=args.compare_batches, broker=args.broker)
                edge[name].append(e)
                job = PeerJob(e.points, slowdowns)
                jobs[name].append(job)
                if pool is not None and baseline == "torch":
                    try:
                        peer[name].append(pool.run(job))
                        continue
                    except PeerFailed as exc:
                        failure = str(exc)
                        pool.close()
                if failure and baseline == "torch":
                    print(f"torch.distributed.pipelining {schedule_name} on gloo/CPU failed: {failure}")
                    print("falling back to a synchronous GPipe pipeline over direct TCP sockets")
                    baseline = "sockets"
                    pool = None
                    for done in peer.values():
                        done.clear()
                if pool is None:
                    pool = stack.enter_context(PeerPool(config("sockets")))
                    # Redo the runs that torch did before it failed, with the same splits.
                    for other, earlier in jobs.items():
                        for j in earlier[len(peer[other]) :]:
                            peer[other].append(pool.run(j))
                else:
                    peer[name].append(pool.run(job))
        startup = pool.startup_seconds if pool is not None else 0.0

    peer_label = f"torch {schedule_name} (gloo)" if baseline == "torch" else "sockets GPipe (TCP)"
    splits = sorted({str(j.points) for js in jobs.values() for j in js})
    print(
        f"\nedgeagent (MQTT, K = {n}) vs {peer_label}: mlp (6 layers) on digits, batch 32, "
        f"{args.compare_batches} batches per run (peer: {args.microbatches} micro-batches of 32 per step), "
        f"splits {', '.join(splits)}, median of {args.repeats}; peer start-up {startup:.1f} s, untimed"
    )
    print(f"{'set-up':<24}{'edgeagent samples/s':>21}{peer_label + ' samples/s':>36}{'ratio':>9}")
    rows: dict[str, dict[str, Any]] = {}
    for name in SETUPS:
        e_sps = statistics.median(r.samples_per_second for r in edge[name])
        p_sps = statistics.median(r.samples_per_second for r in peer[name])
        ratio = e_sps / p_sps
        print(f"{name:<24}{e_sps:>21.1f}{p_sps:>36.1f}{ratio:>8.3f}x")
        rows[name] = {
            "edgeagent": [asdict(r) for r in edge[name]],
            "peer": [asdict(r) for r in peer[name]],
            "edgeagent_samples_per_second": e_sps,
            "peer_samples_per_second": p_sps,
            "ratio": ratio,
        }
    print("ratio = edgeagent / peer. Training loss at the end (edgeagent: last 10 batches; peer: last step):")
    for name in SETUPS:
        e_loss = statistics.median(r.final_loss for r in edge[name])
        p_loss = statistics.median(r.final_loss for r in peer[name])
        print(f"  {name}: edgeagent {e_loss:.3f}, peer {p_loss:.3f}")
    return {"peer": peer_label, "torch_failure": failure, "setups": rows}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slowdown", type=float, default=10.0, help="part 1: every device's slowdown")
    parser.add_argument("--batches", type=int, default=90, help="part 1: batches per run")
    parser.add_argument("--broker", default=None, help="default: the embedded broker")
    parser.add_argument("--in-flight", type=int, default=0, help="the pipelined bound (default: the default)")
    parser.add_argument("--compare-batches", type=int, default=300, help="part 2: batches of 32 per run")
    parser.add_argument("--repeats", type=int, default=3, help="part 2: runs per set-up (median)")
    parser.add_argument("--microbatches", type=int, default=3, help="part 2: micro-batches of 32 per step")
    parser.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    parser.add_argument("--baseline", choices=["torch", "sockets"], default="torch")
    parser.add_argument("--timeout", type=float, default=120.0, help="part 2: seconds per peer run")
    parser.add_argument("--skip-overlap", action="store_true")
    parser.add_argument("--skip-compare", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    setup_logging("WARNING")
    logging.getLogger("edgeagent").setLevel(logging.WARNING)

    out: dict[str, Any] = {}
    started = time.perf_counter()
    if not args.skip_overlap:
        out["overlap"] = overlap(args)
    if not args.skip_compare:
        out["compare"] = compare(args)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
