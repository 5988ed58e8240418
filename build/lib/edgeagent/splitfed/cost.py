"""PiPar's cost model of one training iteration and one epoch (papers/003 Sec. 3.3.2, eq. 2, 5-13).

Pure: no torch, no I/O. Times are seconds, sizes bytes, bandwidths bytes/s. :mod:`.plan` chooses (P, N)
with it; the module note there says what the graph is and what ours adds to the paper's estimate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "STAGES",
    "Choice",
    "Choices",
    "DeviceCosts",
    "LayerTimes",
    "brute_force_critical_path",
    "calibrate",
    "critical_path",
    "epoch_time",
    "epoch_times",
    "estimate_n",
    "iteration_time",
    "iterations_per_epoch",
    "server_shares",
    "stage_times",
]

STAGES: tuple[str, ...] = ("f_c", "u", "lu", "f_s", "b_s", "d", "ld", "b_c")
"""Keys of :func:`stage_times`: the stages of one mini-batch. ``u``/``d`` hold a link for the bytes' time;
``lu``/``ld`` are the link's per-message latency, a delay that does not hold it (messages overlap in
flight), so it is paid once per chain, not once per mini-batch (missing keys count 0)."""

_SHARE_ROUNDS = 12


@dataclass(frozen=True)
class LayerTimes:
    """Seconds per layer at the full batch size B, forward and backward (profiling, Sec. 3.3.1).

    ``fwd_fixed``/``bwd_fixed`` (optional, same length or empty = 0) are the parts of those times that do
    not shrink with the batch (per-call overhead); the paper assumes 0.
    """

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    fwd_fixed: tuple[float, ...] = ()
    bwd_fixed: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        q = len(self.fwd)
        if q == 0 or len(self.bwd) != q:
            raise ValueError(f"LayerTimes needs fwd and bwd of one length >= 1, got {q} and {len(self.bwd)}")
        for name in ("fwd", "bwd", "fwd_fixed", "bwd_fixed"):
            values = tuple(float(v) for v in getattr(self, name))
            if name.endswith("fixed") and values and len(values) != q:
                raise ValueError(f"LayerTimes.{name} has {len(values)} entries, expected 0 or {q}")
            if any(not math.isfinite(v) or v < 0 for v in values):
                raise ValueError(f"LayerTimes.{name} must be finite and >= 0, got {values}")
            object.__setattr__(self, name, values)
        for full, fixed in ((self.fwd, self.fwd_fixed), (self.bwd, self.bwd_fixed)):
            if any(f > t for f, t in zip(fixed, full, strict=False)):
                raise ValueError(f"a fixed part exceeds its layer's time: {fixed} against {full}")

    @property
    def layers(self) -> int:
        """Q, the number of layers."""
        return len(self.fwd)

    def scaled(self, start: int, end: int, fraction: float, *, backward: bool) -> float:
        """Seconds of layers [start, end) on a batch of ``fraction`` x B (fixed parts unscaled)."""
        full = self.bwd if backward else self.fwd
        fixed = (self.bwd_fixed if backward else self.fwd_fixed) or (0.0,) * len(full)
        return sum(fixed[q] + (full[q] - fixed[q]) * fraction for q in range(start, end))


@dataclass(frozen=True)
class DeviceCosts:
    """One device as the plan sees it: its layer times, links, data size and memory limit."""

    name: str
    times: LayerTimes
    up_bps: float
    down_bps: float
    samples: int
    max_layers: int | None = None  # Q' (memory); None = Q
    latency_s: float = 0.0  # per message, each way

    def __post_init__(self) -> None:
        if self.up_bps <= 0 or self.down_bps <= 0:
            raise ValueError(
                f"device {self.name!r}: bandwidths must be > 0, got {self.up_bps}/{self.down_bps}"
            )
        if self.samples < 0 or self.latency_s < 0:
            raise ValueError(f"device {self.name!r}: samples {self.samples} and latency {self.latency_s} < 0")
        if self.max_layers is not None and self.max_layers < 1:
            raise ValueError(f"device {self.name!r}: max_layers must be >= 1, got {self.max_layers}")

    @property
    def max_split(self) -> int:
        """The largest P this device can hold: min(Q, Q')."""
        q = self.times.layers
        return q if self.max_layers is None else min(q, self.max_layers)


@dataclass(frozen=True)
class Choice:
    """P: layers [0, P) on the device, 1 <= P <= Q; N: mini-batches per iteration of floor(B/N) samples."""

    split: int
    n: int

    def __post_init__(self) -> None:
        if self.split < 1 or self.n < 1:
            raise ValueError(f"Choice needs split >= 1 and n >= 1, got split={self.split}, n={self.n}")


Stages = Mapping[str, float]
Choices = Mapping[str, Choice]


def _fraction(n: int, batch_size: int | None) -> float:
    """The mini-batch as a fraction of B: 1/N (eq. 5-10), or floor(B/N)/B when B is given (eq. 2)."""
    if batch_size is None:
        return 1.0 / n
    if n > batch_size:
        raise ValueError(f"N={n} exceeds the batch size {batch_size}: a mini-batch would be empty")
    return (batch_size // n) / batch_size


def _check(
    device: DeviceCosts, server: LayerTimes, act: Sequence[float], grad: Sequence[float], choice: Choice
) -> None:
    q = device.times.layers
    if server.layers != q or len(act) != q or len(grad) != q:
        raise ValueError(
            f"device {device.name!r} has {q} layers, the server {server.layers}, act_bytes {len(act)}, "
            f"grad_bytes {len(grad)}"
        )
    if not 1 <= choice.split <= device.max_split:
        raise ValueError(f"device {device.name!r}: split {choice.split} not in [1, {device.max_split}]")


def stage_times(
    device: DeviceCosts,
    server: LayerTimes,
    act_bytes: Sequence[float],
    grad_bytes: Sequence[float],
    choice: Choice,
    *,
    server_share: float = 1.0,
    batch_size: int | None = None,
) -> dict[str, float]:
    """Seconds of each stage of one mini-batch (eq. 5-10), keys :data:`STAGES`.

    The server's layers run at ``server_share`` of its speed; P = Q leaves nothing to the server.
    """
    _check(device, server, act_bytes, grad_bytes, choice)
    if not 0 < server_share <= 1:
        raise ValueError(f"server_share must be in (0, 1], got {server_share}")
    p, q = choice.split, device.times.layers
    frac = _fraction(choice.n, batch_size)
    out = {
        "f_c": device.times.scaled(0, p, frac, backward=False),
        "b_c": device.times.scaled(0, p, frac, backward=True),
        "u": 0.0,
        "lu": 0.0,
        "f_s": 0.0,
        "b_s": 0.0,
        "d": 0.0,
        "ld": 0.0,
    }
    if p < q:
        out["u"] = act_bytes[p - 1] * frac / device.up_bps
        out["d"] = grad_bytes[p - 1] * frac / device.down_bps
        out["lu"] = out["ld"] = device.latency_s
        out["f_s"] = server.scaled(p, q, frac, backward=False) / server_share
        out["b_s"] = server.scaled(p, q, frac, backward=True) / server_share
    return out


def critical_path(stages: Sequence[Stages]) -> float:
    """T(b_N^c) over the stage graph (eq. 11-13), one pass over the mini-batches: O(N).

    ``stages[n]`` holds the stage times (:data:`STAGES`) of mini-batch n+1 (they may differ between
    mini-batches).
    """
    if not stages:
        raise ValueError("critical_path needs at least one mini-batch")
    forwards = [0.0] * len(stages)
    t = 0.0
    for n, st in enumerate(stages):
        t += st["f_c"]
        forwards[n] = t
    all_forwarded = forwards[-1]
    up = server = down = back = 0.0
    for n, st in enumerate(stages):
        up = max(forwards[n], up) + st["u"]
        server = max(up + st.get("lu", 0.0), server) + st["f_s"] + st["b_s"]
        down = max(server, down) + st["d"]
        back = max(down + st.get("ld", 0.0), back, all_forwarded) + st["b_c"]
    return back


def _stage_graph(count: int) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """prev() of every stage of Sec. 3.2.2, written out as a graph (for the brute force)."""
    prev: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for n in range(count):
        earlier = n > 0
        prev[("f_c", n)] = [("f_c", n - 1)] if earlier else []
        prev[("u", n)] = [("f_c", n)] + ([("u", n - 1)] if earlier else [])
        prev[("lu", n)] = [("u", n)]  # in flight: the next upload does not wait for it
        prev[("f_s", n)] = [("lu", n)] + ([("b_s", n - 1)] if earlier else [])
        prev[("b_s", n)] = [("f_s", n)]
        prev[("d", n)] = [("b_s", n)] + ([("d", n - 1)] if earlier else [])
        prev[("ld", n)] = [("d", n)]
        prev[("b_c", n)] = [("ld", n), ("f_c", count - 1)] + ([("b_c", n - 1)] if earlier else [])
    return prev


def brute_force_critical_path(stages: Sequence[Stages]) -> float:
    """The longest path from f_1^c to b_N^c by enumerating every path (exponential; for tests only)."""
    prev = _stage_graph(len(stages))
    nexts: dict[tuple[str, int], list[tuple[str, int]]] = {node: [] for node in prev}
    for node, before in prev.items():
        for p in before:
            nexts[p].append(node)
    sink = ("b_c", len(stages) - 1)
    best = 0.0
    # Depth-first over (node, length so far), no memo: every path is walked.
    todo = [(("f_c", 0), stages[0]["f_c"])]
    while todo:
        node, length = todo.pop()
        if node == sink:
            best = max(best, length)
        for nxt in nexts[node]:
            todo.append((nxt, length + stages[nxt[1]].get(nxt[0], 0.0)))
    return best


def iteration_time(
    device: DeviceCosts,
    server: LayerTimes,
    act_bytes: Sequence[float],
    grad_bytes: Sequence[float],
    choice: Choice,
    *,
    server_share: float = 1.0,
    batch_size: int | None = None,
    path: Callable[[Sequence[Stages]], float] = critical_path,
) -> float:
    """Estimated seconds of one iteration (eq. 11-13), linear in N (``path=brute_force_critical_path``
    enumerates every path of the stage graph instead, exponential in N)."""
    st = stage_times(
        device, server, act_bytes, grad_bytes, choice, server_share=server_share, batch_size=batch_size
    )
    return path([st] * choice.n)


def estimate_n(
    device: DeviceCosts,
    server: LayerTimes,
    act_bytes: Sequence[float],
    grad_bytes: Sequence[float],
    split: int,
    *,
    batch_size: int | None = None,
    server_share: float = 1.0,
) -> int:
    """Eq. 14: N = 1 + ceil((u + f^s + b^s + d) / min(f^c, b^c)) at the full batch, capped at B if given.

    (The paper's middle line sums the server's forward over layers 1..P, a typo: the server holds P+1..Q.)
    """
    st = stage_times(device, server, act_bytes, grad_bytes, Choice(split, 1), server_share=server_share)
    idle = st["u"] + st["lu"] + st["f_s"] + st["b_s"] + st["d"] + st["ld"]
    busy = min(st["f_c"], st["b_c"])
    n = 1 if idle == 0 else (1 + math.ceil(idle / busy) if busy > 0 else 1 << 30)
    return max(1, min(n, batch_size)) if batch_size is not None else n


def iterations_per_epoch(samples: int, batch_size: int, n: int) -> int:
    """floor(|D_k| / (N floor(B/N))): Algorithm 1, line 3."""
    return samples // ((batch_size // n) * n)


def _server_work(device: DeviceCosts, server: LayerTimes, choice: Choice, batch_size: int) -> float:
    frac = _fraction(choice.n, batch_size)
    q = server.layers
    return choice.n * (
        server.scaled(choice.split, q, frac, backward=False)
        + server.scaled(choice.split, q, frac, backward=True)
    )


def server_shares(
    devices: Sequence[DeviceCosts],
    server: LayerTimes,
    act_bytes: Sequence[float],
    grad_bytes: Sequence[float],
    batch_size: int,
    choices: Choices,
) -> dict[str, float]:
    """Each device's share of the server when all train at once (processor sharing, damped fixed point)."""
    k = len(devices)
    shares = {d.name: 1.0 for d in devices}
    if k <= 1:
        return shares
    work = {d.name: _server_work(d, server, choices[d.name], batch_size) for d in devices}
    for _ in range(_SHARE_ROUNDS):
        loads = {}
        for d in devices:
            t = iteration_time(
                d,
                server,
                act_bytes,
                grad_bytes,
                choices[d.name],
                server_share=shares[d.name],
                batch_size=batch_size,
            )
            loads[d.name] = min(1.0, work[d.name] / t) if t > 0 else 0.0
        total = sum(loads.values())
        for d in devices:
            target = max(1.0 / k, 1.0 - (total - loads[d.name]))
            shares[d.name] = 0.5 * (shares[d.name] + target)
    return shares


def _sync_time(device: DeviceCosts, split: int, param_bytes: Sequence[float] | None) -> float:
    """FedAvg: the device-side model up and the global one down, once per epoch."""
    if param_bytes is None:
        return 0.0
    size = float(sum(param_bytes[:split]))
    return size / device.up_bps + size / device.down_bps


def epoch_times(
    devices: Sequence[DeviceCosts],
    server: LayerTimes,
    act_bytes: Sequence[float],
    grad_bytes: Sequence[float],
    batch_size: int,
    choices: Choices,
    *,
    contention: bool = True,
    param_bytes: Sequence[float] | None = None,
) -> dict[str, float]:
    """Estimated seconds of one epoch per device: iterations x iteration time (+ the FedAvg exchange)."""
    shares = (
        server_shares(devices, server, act_bytes, grad_bytes, batch_size, choices)
        if contention
        else {d.name: 1.0 for d in devices}
    )
    out = {}
    for d in devices:
        c = choices[d.name]
        t = iteration_time(
            d, server, act_bytes, grad_bytes, c, server_share=shares[d.name], batch_size=batch_size
        )
        out[d.name] = iterations_per_epoch(d.samples, batch_size, c.n) * t + _sync_time(
            d, c.split, param_bytes
        )
    return out


def epoch_time(
    devices: Sequence[DeviceCosts],
    server: LayerTimes,
    act_bytes: Sequence[float],
    grad_bytes: Sequence[float],
    batch_size: int,
    choices: Choices,
    *,
    contention: bool = True,
    param_bytes: Sequence[float] | None = None,
) -> float:
    """The epoch ends when the slowest device is done (FedAvg waits for all): max of :func:`epoch_times`."""
    times = epoch_times(
        devices,
        server,
        act_bytes,
        grad_bytes,
        batch_size,
        choices,
        contention=contention,
        param_bytes=param_bytes,
    )
    return max(times.values())


def calibrate(
    device: DeviceCosts, choice: Choice, batch_size: int, compute_seconds: float, iterations: int
) -> DeviceCosts:
    """``device`` corrected by an epoch measured at ``choice``: its compute over ``iterations``.

    Every layer's times (fixed parts too) scale by measured / estimated compute: the profile's shape (which
    layers cost what, and the per-call part it fitted) is kept and its level follows the device as it runs
    (contention, throttling, a profile taken cold). Attributing the excess to a per-mini-batch cost instead
    was tried: one epoch at N = 3 then charged a P = 1, N = 21 plan 8 s of overhead that it does not have.
    """
    if iterations < 1 or compute_seconds <= 0:
        return device
    frac = _fraction(choice.n, batch_size)
    times = device.times
    per_batch = times.scaled(0, choice.split, frac, backward=False) + times.scaled(
        0, choice.split, frac, backward=True
    )
    estimated = iterations * choice.n * per_batch
    if estimated <= 0:
        return device
    ratio = compute_seconds / estimated
    return dataclasses.replace(
        device,
        times=LayerTimes(
            tuple(t * ratio for t in times.fwd),
            tuple(t * ratio for t in times.bwd),
            tuple(t * ratio for t in times.fwd_fixed),
            tuple(t * ratio for t in times.bwd_fixed),
        ),
    )
