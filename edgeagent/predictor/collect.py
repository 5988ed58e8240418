"""Collecting the predictor's pre-training data on this machine under many resource configurations.

What the paper did (papers/004 Sec. 4.2): it measured every sub-model's time on three server CPUs
(Xeon E5-2640, EPYC 7402, Kunpeng 920), simulating "various levels of computing capacities" by limiting
the cores with ``taskset``: about 5,000 samples over 24 resource configurations.

What we do: we have one machine (2 cores), so the configurations must differ in ways that do *not*
scale every layer alike, or ``h`` would carry one number and the predictor would learn nothing about
devices. Each :class:`ResourceConfig` combines

* the torch thread count (1 or 2: wide convolutions gain from a second thread, small layers do not);
* a CFS CPU quota (cgroup v1 ``cpu.cfs_quota_us`` per ``cpu.cfs_period_us``, a fraction of a core up
  to 1.5 cores: a step shorter than the quota runs at full speed, a longer one is throttled);
* a ``taskset`` core list (two threads on one core: oversubscribed, unlike a quota);
* the batch size (16, 32, 64: fixed per-layer overheads against compute);
* the runtime's emulated slowdown (:func:`edgeagent.runtime.compute.emulated_duration`, CPU time times
  the factor, as the pipeline's emulated devices run).
* a CPU of another kind, emulated by the instruction set the kernels may use (``ResourceConfig.isa``:
  AVX2 or SSE instead of this machine's own, through ``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA``).

Every configuration runs as its own child process (``python -m edgeagent.predictor.collect --child``)
in its own cgroup under :data:`GROUP_ROOT` and under ``taskset -c`` when it names cores; the child
measures ``h`` (:func:`~edgeagent.predictor.measure.characterise`) and the time of every one of the
``l(l+1)/2`` sub-models (:func:`~edgeagent.predictor.measure.measure_rounds`: the fastest of
:data:`ROUNDS` interleaved windows, a window the mean of at least ``reps`` back-to-back runs and
:data:`WINDOW` s after a warm-up) and writes one record. The parent
writes the data set after every configuration (atomically), so an interrupted collection resumes
where it stopped.

    python -m edgeagent.predictor.collect --set SET --out data.json [--resume]      (root for quotas)

SET is one of training, training-short, heldout, heldout-isa, heldout-full (:data:`SETS`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from edgeagent.models import ModelSpec
from edgeagent.ops import cgroups
from edgeagent.predictor.configs import (
    ISAS,
    SETS,
    ResourceConfig,
    _positive_int,
    config_name,
    config_set,
    held_out_configs,
    parse_cpus,
    training_configs,
)
from edgeagent.predictor.dataset import FORMAT, check_record, dumps_document, load_document, load_records
from edgeagent.predictor.defaults import ROUNDS
from edgeagent.predictor.evaluate import repeatability
from edgeagent.predictor.machine import cpu_model, machine_info
from edgeagent.predictor.measure import ModelLayers, best_window, characterise, measure_rounds, model_key
from edgeagent.predictor.submodels import REPRESENTATIVES, all_ranges

log = logging.getLogger(__name__)

CGROUP_V1_CPU = cgroups.V1_CPU_ROOT  # the name stays; the quotas go where cgroups.CPU_ROOT says (v1 or v2)
GROUP_ROOT = cgroups.CPU_ROOT / "edgeagent-predictor"
H_BUDGET = 600.0  # seconds the child may spend on h (characterise's bound); collection is not bounded
# ROUNDS (in .defaults, for the CLI's help): windows per sub-model, of at least WINDOW s each.
WINDOW = 0.25
# A configuration whose windows agree with each other (split-half, within ±10 %) for fewer sub-models than
# this is reported noisy. The training machine's own ran 14-99 % (4 rounds); the VMs whose sets no method
# predicted well (an Intel Xeon, an AMD EPYC on a noisy day) 33-68 % (8 rounds).
NOISY = 0.5
OMP_WAIT_POLICY = "PASSIVE"
CHILD_TIMEOUT = 3600.0  # seconds one configuration may take before its child is killed


class Timing(NamedTuple):
    """How every sub-model is timed: ``rounds`` windows, each over at least ``reps`` runs."""

    reps: int
    rounds: int


TARGET = ModelSpec("mobilenetv2", (1, 8, 8), 10)  # the digits-shaped MobileNetV2 (21 layers, M = 231)

_JOIN = cgroups.JOIN  # the shell joins the cgroup, then execs the command


# -- the child: one configuration --------------------------------------------------------------------


def _own_cgroup() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpu" in controllers.split(","):
                return path
    return ""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _load() -> float:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else -1.0


def _sig(x: float) -> float:
    return float(f"{x:.7g}")  # seconds to 7 significant digits: far below the noise


def measure_config(
    cfg: ResourceConfig, spec: ModelSpec, reps: int, *, rounds: int = ROUNDS
) -> dict[str, Any]:
    """Measure ``h`` and every sub-model's seconds in this process, under ``cfg``'s threads, batch size
    and slowdown (its quota and cores are the parent's doing), each the fastest of ``rounds`` windows;
    the data set's record."""
    torch.set_num_threads(cfg.threads)
    capability = torch.backends.cpu.get_cpu_capability()
    if cfg.isa is not None and capability != ISAS[cfg.isa][0].upper():
        raise RuntimeError(
            f"{cfg.name}: asked for the {cfg.isa} instruction set (ATEN_CPU_CAPABILITY="
            f"{ISAS[cfg.isa][0]}), but torch runs {capability}: this CPU lacks it"
        )
    started, cpu_started, load_before = time.perf_counter(), time.process_time(), _load()
    model = ModelLayers.build(spec, cfg.batch_size)
    timing = Timing(reps, rounds)._asdict()
    char = characterise(
        model, budget=H_BUDGET, slowdown=cfg.slowdown, min_seconds=WINDOW, tiles=False, **timing
    )
    if not char.complete:
        raise RuntimeError(f"{cfg.name}: measured {len(char.h)} of h's {REPRESENTATIVES} in {H_BUDGET:g} s")
    ranges = all_ranges(model.num_layers)
    windows = measure_rounds(model, ranges, slowdown=cfg.slowdown, min_seconds=WINDOW, **timing)
    seconds = [best_window(w) for w in windows]
    return {
        "config": cfg.to_dict(),
        "model": spec.to_dict(),
        "model_key": model_key(spec),
        "batch_size": cfg.batch_size,
        "num_layers": model.num_layers,
        "flops": list(model.flops),
        "h": [_sig(x) for x in char.h],
        "ranges": [list(r) for r in ranges],
        "seconds": [_sig(x) for x in seconds],
        "round_seconds": [[_sig(x) for x in w] for w in windows],  # each round's window, for the spread
        "reps": reps,
        "rounds": rounds,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": capability,
        "host": platform.node(),
        "cpu": cpu_model(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
        "cgroup": _own_cgroup(),
        "measured_at": _now(),
        "elapsed": round(time.perf_counter() - started, 3),
        # Other work on the machine shows here: CPU seconds well under threads x elapsed, a high load.
        "cpu_seconds": round(time.process_time() - cpu_started, 3),
        "load_average": [load_before, _load()],  # 1-minute load average before and after
    }


def write_json_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- the parent: cgroups and child processes ---------------------------------------------------------


def cgroup_problem() -> str | None:
    """Why configurations with a CPU quota cannot run here, or None when they can."""
    missing = cgroups.cgroup_problem(cgroups.CPU_ROOT)
    return None if missing is None else f"CPU quotas need {missing}"


def make_group(cfg: ResourceConfig, root: Path = GROUP_ROOT) -> Path:
    """The configuration's cgroup with its CFS quota (edgeagent.ops.cgroups: the same 10 ms period)."""
    return cgroups.make_cgroup(root / cfg.name, cfg.cpu_quota)


def remove_groups(groups: Sequence[Path], root: Path = GROUP_ROOT) -> None:
    """Remove the groups this collection made (they are empty: their child has exited) and the root
    if nothing else is left in it. Nothing is killed: a group still in use is left and reported."""
    for group in groups:
        try:
            group.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("could not remove cgroup %s: %s", group, e)
    with contextlib.suppress(OSError):
        root.rmdir()  # fails while another collection's groups are in it, as it should


def child_command(
    cfg: ResourceConfig, spec: ModelSpec, reps: int, out: Path, group: Path | None, *, rounds: int = ROUNDS
) -> list[str]:
    """``[sh -c join group] [taskset -c cpus] python -m edgeagent.predictor.collect --child ...``."""
    cmd = [
        sys.executable, "-m", "edgeagent.predictor.collect",
        "--child", json.dumps(cfg.to_dict()), "--model", json.dumps(spec.to_dict()),
        "--reps", str(reps), "--rounds", str(rounds), "--out", str(out),
    ]  # fmt: skip
    if cfg.cpus is not None:
        cmd = ["taskset", "-c", cfg.cpus, *cmd]
    if group is not None:
        cmd = ["sh", "-c", _JOIN, str(group), *cmd]
    return cmd


def _child_env(cfg: ResourceConfig) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(cfg.threads), MKL_NUM_THREADS=str(cfg.threads))
    # Idle OpenMP threads sleep instead of spinning: a spinning second thread burns the quota the
    # working one needs, and two-thread timings under a quota then repeat 25 % of the time, not 100 %
    # (docs/design.md, "How a time is measured").
    env["OMP_WAIT_POLICY"] = OMP_WAIT_POLICY
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        env.pop(name, None)  # the machine's own unless the configuration emulates another CPU
    if cfg.isa is not None:
        env["ATEN_CPU_CAPABILITY"], env["ONEDNN_MAX_CPU_ISA"] = ISAS[cfg.isa]
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env


def skip_reason(cfg: ResourceConfig, cgroups: str | None) -> str | None:
    """Why ``cfg`` cannot run on this machine (``cgroups``: :func:`cgroup_problem`), or None."""
    if cfg.cpu_quota is not None and cgroups is not None:
        return f"needs a CPU quota of {cfg.cpu_quota:g} cores, but {cgroups}"
    if cfg.cpus is not None:
        if shutil.which("taskset") is None:
            return f"needs taskset -c {cfg.cpus}, but taskset is not installed"
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        absent = [c for c in parse_cpus(cfg.cpus) if c not in allowed]
        if absent:
            return f"needs cores {absent}, but this process may run on {allowed} only"
    return None


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_child(cmd: list[str], env: Mapping[str, str], out: Path, timeout: float) -> dict[str, Any]:
    """Run one child to completion and return its record; RuntimeError says why it gave none. The
    child is killed (it alone) if it overruns ``timeout`` or the collection is interrupted."""
    proc = subprocess.Popen(
        cmd,
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"took more than {timeout:g} s and was killed\n{_tail(err)}") from None
    finally:
        if proc.poll() is None:  # interrupted (Ctrl-C): the child runs in its own session
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"exited with {proc.returncode}\n{_tail(err)}")
    try:
        record: dict[str, Any] = json.loads(out.read_text())
        check_record(record)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"wrote no valid record: {e}\n{_tail(err)}") from None
    return record


@dataclass
class Summary:
    """What a :func:`collect` call did."""

    path: Path
    collected: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    noisy: dict[str, float] = field(default_factory=dict)  # measured now, split-half under NOISY
    samples: int = 0  # sub-model times in the file
    seconds: float = 0.0


def _provenance(
    spec: ModelSpec,
    configs: Sequence[ResourceConfig],
    timing: Timing,
    summary: Summary,
    created_at: str,
) -> dict[str, Any]:
    return {
        "paper": "papers/004 Sec. 4.2: ~5,000 samples over 24 taskset configurations on three CPUs",
        "method": "one child process per configuration (cgroup v1 CFS quota, taskset, torch threads, "
        "batch size, emulated slowdown); seconds: the fastest of ROUNDS interleaved windows, a window "
        "the mean of back-to-back forward+backward runs over at least reps runs and WINDOW s after a "
        "warm-up",
        "rounds": timing.rounds,
        "window_seconds": WINDOW,
        "omp_wait_policy": OMP_WAIT_POLICY,
        "machine": machine_info(),
        "created_at": created_at,
        "updated_at": _now(),
        "command": shlex.join(sys.argv),
        "model": spec.to_dict(),
        "model_key": model_key(spec),
        "reps": timing.reps,
        "configs": len(configs),
        "config_names": [c.name for c in configs],
        "cgroups": cgroup_problem()
        or f"cgroup v{cgroups.cgroup_version(cgroups.CPU_ROOT)} cpu, groups under {GROUP_ROOT}",
        "skipped": dict(summary.skipped),
        "failed": dict(summary.failed),
    }


def _previous(path: Path, spec: ModelSpec, resume: bool) -> tuple[list[dict[str, Any]], str]:
    """The records (and creation time) to keep from an earlier, interrupted collection into ``path``."""
    if not path.exists():
        return [], _now()
    if not resume:
        log.warning("%s exists and is replaced (resume=False)", path)
        return [], _now()
    doc = load_document(path)
    key = model_key(spec)
    other = [r["model_key"] for r in doc["records"] if r["model_key"] != key]
    if other:
        raise ValueError(
            f"{path}: holds records of model {other[0]}, not of {key} ({spec.name}); cannot resume"
        )
    return list(doc["records"]), str(doc["provenance"].get("created_at", _now()))


def _check_unique(configs: Sequence[ResourceConfig]) -> None:
    names = [c.name for c in configs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"configuration names must be unique; given twice: {twice}")


def _progress(enabled: bool) -> Progress:
    from edgeagent.ops.logs import console

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=console, disable=not enabled)


def _reusable(record: Mapping[str, Any], cfg: ResourceConfig, timing: Timing) -> bool:
    same = ResourceConfig.from_dict(record["config"]) == cfg and record["reps"] == timing.reps
    return same and record.get("rounds", 1) == timing.rounds


@contextlib.contextmanager
def _groups() -> Iterator[list[Path]]:
    made: list[Path] = []
    try:
        yield made
    finally:
        remove_groups(made)


def _measure_one(
    cfg: ResourceConfig,
    spec: ModelSpec,
    timing: Timing,
    cgroups: str | None,
    made: list[Path],
    timeout: float,
) -> dict[str, Any]:
    group = None
    if cgroups is None:
        group = make_group(cfg)
        made.append(group)
    with tempfile.TemporaryDirectory(prefix="edgeagent-collect-") as tmp:
        out = Path(tmp) / "record.json"
        cmd = child_command(cfg, spec, timing.reps, out, group, rounds=timing.rounds)
        return run_child(cmd, _child_env(cfg), out, timeout)


def collect(
    spec: ModelSpec,
    configs: Sequence[ResourceConfig],
    out_path: str | Path,
    *,
    reps: int = 2,
    rounds: int = ROUNDS,
    progress: bool = True,
    resume: bool = False,
    timeout: float = CHILD_TIMEOUT,
) -> Summary:
    """Measure ``spec`` under every configuration, one child process each, into ``out_path``.

    The file is rewritten (atomically) after every configuration; with ``resume`` the records already
    in it for an equal configuration, ``reps`` and ``rounds`` are kept and not measured again. A
    configuration that cannot run here (a quota without root or cgroup v1, cores this machine lacks) is
    skipped with a warning; a child that fails is reported and skipped. The cgroups made are removed at
    the end.
    """
    _check_unique(configs)
    _positive_int(reps, "reps", 10_000)
    _positive_int(rounds, "rounds", 1000)
    timing = Timing(reps, rounds)
    path = Path(out_path)
    summary = Summary(path)
    records, created_at = _previous(path, spec, resume)
    cgroups = cgroup_problem()
    started = time.monotonic()
    with _groups() as made, _progress(progress) as bar:
        task = bar.add_task("collecting", total=len(configs))
        for cfg in configs:
            bar.update(task, description=cfg.name)
            _one(cfg, spec, timing, records, summary, cgroups, made, timeout)
            summary.samples = sum(len(r["seconds"]) for r in records)
            provenance = _provenance(spec, configs, timing, summary, created_at)
            write_json_atomic(path, dumps_document(provenance, records))
            bar.advance(task)
    summary.seconds = time.monotonic() - started
    return summary


def _one(
    cfg: ResourceConfig,
    spec: ModelSpec,
    timing: Timing,
    records: list[dict[str, Any]],
    summary: Summary,
    cgroups: str | None,
    made: list[Path],
    timeout: float,
) -> None:
    """Reuse, skip or measure one configuration, updating ``records`` and ``summary``."""
    index = next((i for i, r in enumerate(records) if r["config"]["name"] == cfg.name), None)
    if index is not None and _reusable(records[index], cfg, timing):
        summary.reused.append(cfg.name)
        return
    reason = skip_reason(cfg, cgroups)
    if reason is not None:
        log.warning("skipping %s: %s", cfg.name, reason)
        summary.skipped[cfg.name] = reason
        return
    began = time.monotonic()
    try:
        record = _measure_one(cfg, spec, timing, cgroups, made, timeout)
    except (RuntimeError, OSError) as e:
        log.error("configuration %s failed, skipped: %s", cfg.name, e)
        summary.failed[cfg.name] = str(e).splitlines()[0]
        return
    if index is not None:
        records[index] = record  # measured again: other reps or rounds, or a changed configuration
    else:
        records.append(record)
    summary.collected.append(cfg.name)
    agreement = repeatability(record)
    log.info(
        "%s: %d sub-models in %.0f s; its windows agree with each other within ±10 %% for %s",
        cfg.name, len(record["seconds"]), time.monotonic() - began,
        "? (one round)" if agreement is None else f"{agreement[1]:.0%} of them (split-half)",
    )  # fmt: skip
    if agreement is not None and agreement[1] < NOISY:
        summary.noisy[cfg.name] = agreement[1]
        log.warning(
            "%s is noisy: its even rounds' times and its odd rounds' agree within ±10 %% for only %.0f %% "
            "of sub-models, so no predictor can be tested on it to ±10 %%; other work or a shared VM's "
            "neighbours slow its windows: measure it again on a quieter machine or with more --rounds "
            "(now %d)", cfg.name, 100 * agreement[1], timing.rounds,
        )  # fmt: skip


# -- command line ------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m edgeagent.predictor.collect",
        description="Collect the latency predictor's pre-training data under many resource configurations.",
    )
    p.add_argument(
        "--model", default=json.dumps(TARGET.to_dict()), help="model spec as JSON (default: %(default)s)"
    )
    p.add_argument("--reps", type=int, default=2, help="least timed runs per window (default: 2)")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="windows per sub-model (default: %(default)s)")
    p.add_argument("--out", required=True, help="data set file (parent) or record file (--child)")
    p.add_argument("--set", choices=sorted(SETS), default="training", help="which configurations")
    p.add_argument("--resume", action="store_true", help="keep the configurations already in --out")
    p.add_argument("--timeout", type=float, default=CHILD_TIMEOUT, help="seconds per configuration")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--child", metavar="CONFIG_JSON", help="internal: measure one configuration in this process"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    spec = ModelSpec.from_dict(json.loads(args.model))
    if args.child is not None:
        cfg = ResourceConfig.from_dict(json.loads(args.child))
        record = measure_config(cfg, spec, args.reps, rounds=args.rounds)
        write_json_atomic(Path(args.out), json.dumps(record, sort_keys=True) + "\n")
        return 0
    from edgeagent.ops.logs import setup_logging
    from edgeagent.ops.signals import sigterm_unwinds

    setup_logging()
    configs = config_set(args.set)
    with sigterm_unwinds():
        s = collect(spec, configs, args.out, reps=args.reps, rounds=args.rounds,
                    progress=not args.no_progress, resume=args.resume, timeout=args.timeout)  # fmt: skip
    log.info(
        "%s: %d measured (%d of them noisy), %d kept, %d skipped, %d failed; %d samples; %.0f s",
        s.path, len(s.collected), len(s.noisy), len(s.reused), len(s.skipped), len(s.failed), s.samples,
        s.seconds,
    )  # fmt: skip
    return 1 if s.failed else 0


__all__ = [
    "CGROUP_V1_CPU",
    "FORMAT",
    "GROUP_ROOT",
    "NOISY",
    "ROUNDS",
    "SETS",
    "TARGET",
    "ResourceConfig",
    "Summary",
    "Timing",
    "cgroup_problem",
    "check_record",
    "child_command",
    "collect",
    "config_name",
    "config_set",
    "held_out_configs",
    "load_document",
    "load_records",
    "main",
    "measure_config",
    "parse_cpus",
    "skip_reason",
    "training_configs",
]


if __name__ == "__main__":
    sys.exit(main())
