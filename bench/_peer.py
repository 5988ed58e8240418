"""The peer of ``bench/pipeline.py`` part 2: the same model trained by ``torch.distributed.pipelining``
(``Schedule1F1B`` or ``ScheduleGPipe`` over gloo) or by a plain synchronous GPipe pipeline over TCP sockets,
one process per stage, started once per model and handed one :class:`PeerJob` per run.

Each stage process builds layers ``points[r]:points[r + 1]`` of the seeded model with edgeagent's own
``build_layers`` (the very modules an edgeagent stage holds), wrapped in :class:`Slowed` on a slow stage.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import os
import queue
import socket
import statistics
import struct
import time
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from edgeagent.broker import free_port
from edgeagent.data import Dataset, batch_indices, batches_per_epoch, load_dataset
from edgeagent.models import ModelSpec, build_layers
from edgeagent.runtime.compute import Clock, emulate_slowdown

# What both sides train with (edgeagent's TrainConfig gets the same).
BATCH_SIZE = 32
LEARNING_RATE = 0.05
MOMENTUM = 0.5
WEIGHT_DECAY = 4e-5
SEED = 0

Baseline = Literal["torch", "sockets"]


class _Mark:
    """When the backward of one micro-batch started on the slow stage."""

    __slots__ = ("clock", "factor")

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.clock = Clock(factor)


class _BackwardStarts(torch.autograd.Function):
    """Identity on the stage's output; its backward runs first in the stage: start the clock."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mark: _Mark) -> torch.Tensor:
        ctx.mark = mark
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.mark.clock = Clock(ctx.mark.factor)
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
    before the next one's starts (one thread per process), so one mark per forward suffices. The
    optimizer step is stretched too (:func:`_update`), as edgeagent's stage stretches its own.
    """

    def __init__(self, inner: nn.Module, factor: float) -> None:
        super().__init__()
        self.inner = inner
        self.factor = factor
        # Not a parameter: the optimizer never sees it, and it never gets a gradient.
        self.anchor = torch.zeros((), requires_grad=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        started = Clock(self.factor)
        mark = _Mark(self.factor)
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
    model: str = "mlp"
    dataset: str = "digits"
    model_options: tuple[tuple[str, Any], ...] = ()


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
    busy: float = 0.0  # calibration: this stage's work of one step alone, wall seconds (sleep included)
    cpu: float = 0.0  # ... and its CPU seconds


@dataclass(frozen=True)
class Calibrate:
    """Time one stage's own work of a step (its slowdown included), alone on the machine."""

    job: PeerJob


def _stage_module(
    config: PeerConfig, job: PeerJob, rank: int, in_shape: tuple[int, ...], num_classes: int
) -> nn.Module:
    """Layers ``points[rank]:points[rank + 1]`` of the same seeded model edgeagent builds (its own
    ``build_layers``: bit-identical initial weights whichever range a device builds)."""
    spec = ModelSpec(config.model, in_shape, num_classes, config.model_options)
    start, end = job.points[rank], job.points[rank + 1]
    module: nn.Module = nn.Sequential(*build_layers(spec, start, end, seed=SEED))
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


def _update(optimizer: torch.optim.Optimizer, module: nn.Module) -> None:
    """The step's update, ``factor`` times slower on a slow stage: a slow device's optimizer step is
    slow too, and edgeagent's stage counts its update in the step it stretches (``pipeline.step``)."""
    factor = module.factor if isinstance(module, Slowed) else 1.0
    started = Clock(factor)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    emulate_slowdown(started, factor)


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
        _update(optimizer, module)

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
        _update(optimizer, module)
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


def _stage_work(
    config: PeerConfig,
    job: PeerJob,
    rank: int,
    module: nn.Module,
    steps: list[tuple[torch.Tensor, torch.Tensor]],
    data: Dataset,
) -> StageResult:
    """The stage's own work in a step of the run (``M`` forwards and backwards, one update), with no
    communication, while the other stages idle: wall and CPU seconds per step, a median of repeats.

    The input is the real activation (layers ``0:points[rank]`` of the same seeded model on the
    micro-batches of step 1), the gradient into the output a fixed random one; the last stage computes the
    loss as the schedule does. This is what no pipeline with these stages can go below per step, bubble
    or not: the bench's bound (:func:`ideal_step`)."""
    spec = ModelSpec(config.model, data.in_shape, data.num_classes, config.model_options)
    m = config.microbatches
    x, y = steps[1 % len(steps)]
    xs, ys = x.chunk(m), y.chunk(m)
    with torch.no_grad():
        if job.points[rank] > 0:
            prefix = nn.Sequential(*build_layers(spec, 0, job.points[rank], seed=SEED))
            inputs = [prefix(xk) for xk in xs]
        else:
            inputs = list(xs)
    last = rank == config.num_stages - 1
    generator = torch.Generator().manual_seed(rank)
    grads: list[torch.Tensor] = []
    optimizer = _optimizer(module)

    def step() -> None:
        for k in range(m):
            inp = inputs[k].detach().requires_grad_(rank > 0)
            out = module(inp)
            if last:
                (nn.functional.cross_entropy(out, ys[k]) / m).backward()
            else:
                if len(grads) <= k:
                    grads.append(torch.randn(out.shape, generator=generator) * 1e-3)
                out.backward(grads[k])
        _update(optimizer, module)

    step()  # warm-up
    walls: list[float] = []
    cpus: list[float] = []
    budget = time.perf_counter() + 1.0
    while len(walls) < 5 or (time.perf_counter() < budget and len(walls) < 200):
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return StageResult(rank, busy=statistics.median(walls), cpu=statistics.median(cpus))


def ideal_step(stages: list[StageResult], cores: int) -> float:
    """The shortest step any pipeline of these stages could take on ``cores`` cores with free messages and
    no bubble: the busiest stage's own work, or all stages' CPU shared out over the cores."""
    return max(max(s.busy for s in stages), sum(s.cpu for s in stages) / cores)


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
        data = load_dataset(config.dataset, seed=SEED)
        steps = peer_steps(data, config.microbatches, config.batches)
        results.put(StageResult(rank, ready=True))
        module: nn.Module | None = None
        while (job := commands.get()) is not None:
            if isinstance(job, Calibrate):
                assert module is not None, "calibrate after a run"
                results.put(_stage_work(config, job.job, rank, module, steps, data))
                continue
            module = _stage_module(config, job, rank, data.in_shape, data.num_classes)
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


@dataclass(frozen=True)
class PeerRun:
    samples_per_second: float
    seconds: float
    samples: int
    final_loss: float
    points: list[int]
    step_seconds: float = float("nan")  # the peer's step, measured
    ideal_step_seconds: float = float("nan")  # ideal_step of its stages on this machine

    @property
    def bound(self) -> float:
        """The most a bubble-free pipeline with free messages could gain over this run: the set-up's
        ceiling on any ratio to it."""
        return self.step_seconds / self.ideal_step_seconds


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

    def _collect(self, what: str, only: int | None = None) -> dict[int, StageResult]:
        """Every rank's answer, or rank ``only``'s when only it was asked."""
        expected = set(range(self.config.num_stages)) if only is None else {only}
        got: dict[int, StageResult] = {}
        deadline = time.monotonic() + self.config.timeout
        while len(got) < len(expected):
            try:
                r = self._results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                missing = sorted(expected - set(got))
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
        # Then each stage's own work alone, one after the other (two cores would otherwise be shared).
        stages = []
        for rank, commands in enumerate(self._commands):
            commands.put(Calibrate(job))
            stages.append(self._collect(f"calibration of rank {rank}", only=rank)[rank])
        steps = samples / (self.config.microbatches * BATCH_SIZE)
        return PeerRun(
            samples / seconds,
            seconds,
            samples,
            got[self.config.num_stages - 1].final_loss,
            job.points,
            step_seconds=seconds / steps,
            ideal_step_seconds=ideal_step(stages, os.cpu_count() or 1),
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


def peer_label(baseline: Baseline, schedule: str) -> str:
    name = "Schedule1F1B" if schedule == "1f1b" else "ScheduleGPipe"
    return f"torch {name} (gloo)" if baseline == "torch" else "sockets GPipe (TCP)"


class Peer:
    """The peer of one model: its stage processes (started at the first run, closed on exit) and one run
    per distinct (set-up, repeat, split): the peer does not depend on the broker, so the edgeagent runs of
    one set-up and repeat through several brokers share one peer run, unless their splits differ.

    If torch's schedule fails or hangs, it says so and falls back to the sockets baseline, which redoes
    the runs torch did, with the same splits."""

    def __init__(self, base: PeerConfig) -> None:
        self.config = base
        self.failure = ""
        self.startup_seconds = 0.0
        self.runs: dict[tuple[str, int, tuple[int, ...]], PeerRun] = {}
        self._jobs: dict[tuple[str, int, tuple[int, ...]], PeerJob] = {}
        self._pool: PeerPool | None = None
        self._stack = contextlib.ExitStack()

    @property
    def label(self) -> str:
        return peer_label(self.config.baseline, self.config.schedule)

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def run(self, setup: str, repeat: int, job: PeerJob) -> PeerRun:
        key = (setup, repeat, tuple(job.points))
        if key not in self.runs:
            self._jobs[key] = job
            try:
                self.runs[key] = self._started().run(job)
            except PeerFailed as exc:
                if self.config.baseline != "torch":
                    raise
                self._fall_back(str(exc))
                self.runs[key] = self._started().run(job)
        return self.runs[key]

    def _started(self) -> PeerPool:
        if self._pool is None:
            self._pool = self._stack.enter_context(PeerPool(self.config))
            self.startup_seconds = self._pool.startup_seconds
        return self._pool

    def _fall_back(self, failure: str) -> None:
        print(f"{self.label} on CPU failed: {failure}")
        print("falling back to a synchronous GPipe pipeline over direct TCP sockets")
        self.failure = failure
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        ports = [free_port() for _ in self.config.ports]  # the hung ranks' may still be taken
        self.config = replace(self.config, baseline="sockets", ports=ports)
        for key in list(self.runs):
            self.runs[key] = self._started().run(self._jobs[key])
