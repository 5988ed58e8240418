"""One aarch64 worker, the real ARM software stack emulated: Debian arm64 + torch's aarch64 wheel under
qemu-user-static, in a pipeline with an x86 worker and the central node on this machine.

    sudo .venv/bin/python bench/arm_worker.py [--qemu-cpu cortex-a72] [--epochs 3]

What it does (root: chroot, mounts, binfmt_misc):

1. an arm64 root file system: ``debootstrap --arch arm64 --foreign --variant=minbase --include=python3
   bookworm``, second stage in a chroot (python3 3.11, glibc 2.36: Raspberry Pi OS bookworm's). The
   kernel runs its aarch64 binaries through ``qemu-aarch64-static`` (binfmt_misc, registered here with
   the F flag if it is not). Kept in ``--rootfs`` for the next run (about 3 minutes the first time);
2. the worker's dependencies (pyproject.toml's base + ``[worker]``) as aarch64 wheels, installed by
   this machine's pip (``--target --platform manylinux_2_*_aarch64 --only-binary=:all:``) into the root
   file system's /opt/site; torch 2.13.0 from PyPI, which pulls CUDA's aarch64 wheels: 4.9 GB;
3. this source tree bind-mounted read-only at /opt/edgeagent;
4. the per-batch compute of the whole digits MLP (forward + backward, batch 32, one torch thread) with
   this machine's torch and with the aarch64 one under qemu, side by side; and whether a 2-thread
   matmul survives the emulated CPU (torch 2.13.0's aarch64 BLAS, NVPL, dies with SIGILL on ARMv8.0
   cores, Cortex-A53/A72: Pi Zero 2 W, 3, 4);
5. a pipeline run: ``edgeagent central`` (stage 0) + an x86 ``edgeagent worker`` + the aarch64 one over
   Mosquitto on 127.0.0.1:1883 (or one started here), the digits MLP for ``--epochs``; its accuracy and
   each worker's own account of its compute, beside a run of two x86 workers.

The emulated per-batch time is qemu's translation of aarch64 code on an x86 core, not a Pi's: it says
the stack runs and trains, not how fast a Pi is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
BINFMT = Path("/proc/sys/fs/binfmt_misc")
QEMU = Path("/usr/bin/qemu-aarch64-static")
# The aarch64 ELF magic and mask (Debian's qemu-user-binfmt); F: the interpreter is opened now, so it
# works inside a chroot that has no copy of it.
BINFMT_RULE = (
    r":qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:"
    r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:"
    f"{QEMU}:F"
)
PLATFORMS = [f"manylinux_2_{minor}_aarch64" for minor in range(36, 16, -1)] + ["manylinux2014_aarch64"]
BATCH = 32
# A Pi 4's /proc/cpuinfo (2 of its 4 cores: this machine has 2). qemu-user 7.2 shows aarch64 programs the
# host's x86 /proc/cpuinfo, on which torch's cpuinfo library segfaults while torch._C loads (found here:
# exit -11 at `import torch` with /proc mounted, none without /proc or with this file over it).
PI4_CPUINFO = (
    "".join(
        f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n"
        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\n"
        "CPU revision\t: 3\n\n"
        for i in range(2)
    )
    + "Hardware\t: BCM2835\nRevision\t: c03114\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n"
)
FINISHED = re.compile(r"finished after (\d+) batches here; of ([\d.]+) s: compute ([\d.]+)")


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, text=True, **kwargs)  # type: ignore[call-overload]


def worker_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project.get("optional-dependencies", {}).get("worker", [])]


def ensure_binfmt() -> None:
    if not QEMU.exists():
        raise SystemExit(f"no {QEMU}: apt-get install qemu-user-static")
    if not (BINFMT / "register").exists():
        run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)])
    if not (BINFMT / "qemu-aarch64").exists():
        (BINFMT / "register").write_text(BINFMT_RULE)


def ensure_rootfs(rootfs: Path, mirror: str) -> None:
    if (rootfs / "usr/bin/python3").exists() and not (rootfs / "debootstrap").exists():
        return
    if shutil.which("debootstrap") is None:
        raise SystemExit("no debootstrap: apt-get install debootstrap")
    if not (rootfs / "debootstrap").exists():
        run(["debootstrap", "--arch", "arm64", "--foreign", "--variant=minbase", "--include=python3",
             "bookworm", str(rootfs), mirror])  # fmt: skip
    run(["chroot", str(rootfs), "/debootstrap/debootstrap", "--second-stage"])


def ensure_site(rootfs: Path) -> Path:
    site = rootfs / "opt/site"
    if (site / "torch").is_dir():
        return site
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    run([sys.executable, "-m", "pip", "install", "--quiet", "--ignore-installed", "--only-binary=:all:",
         "--python-version", "3.11", "--implementation", "cp", *platforms, "--target", str(site),
         *worker_requirements()])  # fmt: skip
    return site


@contextlib.contextmanager
def mounted(rootfs: Path) -> Iterator[None]:
    """/proc (with a Pi 4's cpuinfo), /dev, /sys and this source tree (read-only) inside the root file
    system, unmounted after."""
    done: list[Path] = []
    cpuinfo = rootfs / "opt/cpuinfo-pi4"
    cpuinfo.parent.mkdir(parents=True, exist_ok=True)
    cpuinfo.write_text(PI4_CPUINFO)
    try:
        for source, target, options in (
            ("proc", rootfs / "proc", ["-t", "proc"]),
            (str(cpuinfo), rootfs / "proc/cpuinfo", ["--bind"]),
            ("/dev", rootfs / "dev", ["--bind"]),
            ("/sys", rootfs / "sys", ["--bind"]),
            (str(ROOT), rootfs / "opt/edgeagent", ["--bind", "-o", "ro"]),
        ):
            if not target.exists():
                target.mkdir(parents=True)
            mounted_already = subprocess.run(["mountpoint", "-q", str(target)], check=False).returncode == 0
            if target.name == "cpuinfo" or not mounted_already:
                run(["mount", *options, source, str(target)])
                done.append(target)
        yield
    finally:
        for target in reversed(done):
            subprocess.run(["umount", "-l", str(target)], check=False)


def arm_command(rootfs: Path, qemu_cpu: str, argv: list[str]) -> list[str]:
    env = [f"QEMU_CPU={qemu_cpu}", "PYTHONPATH=/opt/edgeagent:/opt/site", "PYTHONDONTWRITEBYTECODE=1",
           "PYTHONUNBUFFERED=1", "HOME=/root", "PATH=/usr/bin:/bin"]  # fmt: skip
    return ["chroot", str(rootfs), "/usr/bin/env", "-i", *env, "python3", *argv]


# -- inside either interpreter: one batch's compute ------------------------------------------------------


def time_model(threads: int, reps: int) -> dict[str, object]:
    """Forward + backward of the whole digits MLP at batch 32, the fastest of ``reps``; JSON out."""
    started = time.perf_counter()
    import platform

    import torch

    imported = time.perf_counter() - started
    from edgeagent.models import ModelSpec
    from edgeagent.predictor.measure import ModelLayers

    torch.set_num_threads(threads)
    layers = ModelLayers.build(ModelSpec("mlp", (1, 8, 8), 10), BATCH)
    model = torch.nn.Sequential(*layers.layers)
    x, y = layers.inputs[0], torch.randint(0, 10, (BATCH,))
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        best = min(best, time.perf_counter() - t)
    return {"machine": platform.machine(), "torch": str(torch.__version__), "threads": threads,
            "import_s": round(imported, 2), "batch_ms": round(best * 1e3, 3)}  # fmt: skip


def probe_threads() -> None:
    """A 2-thread 64x64 matmul (the path that dies with SIGILL on ARMv8.0 cores)."""
    import torch

    torch.set_num_threads(2)
    print(float((torch.ones(64, 64) @ torch.ones(64, 64)).sum()))


# -- the pipeline --------------------------------------------------------------------------------------


def broker_url() -> tuple[str, subprocess.Popen[bytes] | None]:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", 1883), timeout=1):
        return "mqtt://127.0.0.1:1883", None
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    quiet = subprocess.DEVNULL
    proc = subprocess.Popen([mosquitto, "-p", str(port)], stdout=quiet, stderr=quiet)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return f"mqtt://127.0.0.1:{port}", proc
        time.sleep(0.1)  # mosquitto says nothing when it listens: poll the port
    raise SystemExit(f"mosquitto did not listen on {port}")


def pipeline(
    workers: dict[str, list[str]], broker: str, epochs: int, out: Path, timeout: float
) -> dict[str, object]:
    """Central + ``workers`` (id -> command prefix); the report and each worker's compute per batch."""
    cluster = f"armbench{os.getpid()}{len(out.name)}"
    procs: dict[str, subprocess.Popen[str]] = {}
    logs = {name: out.with_name(f"{out.stem}-{name}.log") for name in workers}
    try:
        for name, prefix in workers.items():
            argv = [*prefix, "worker", "--broker", broker, "--cluster", cluster, "--id", name]
            out_file = logs[name].open("w")
            procs[name] = subprocess.Popen(argv, stdout=out_file, stderr=subprocess.STDOUT, text=True)
        central = [str(VENV_BIN / "edgeagent"), "central", "--broker", broker, "--cluster", cluster,
                   "--workers", str(len(workers)), "--model", "mlp", "--dataset", "digits",
                   "--epochs", str(epochs), "--report", str(out), "--batch-timeout", "30"]  # fmt: skip
        started = time.perf_counter()
        done = subprocess.run(central, capture_output=True, text=True, timeout=timeout, check=False)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            return {"ok": False, "error": f"central exited {done.returncode}: {done.stderr[-2000:]}"}
        for proc in procs.values():  # the workers stay for the next run: stop them, then read their logs
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=60)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    report = json.loads(out.read_text())
    per_worker = {}
    for name, log in logs.items():
        found = FINISHED.findall(log.read_text())  # one line per stage the worker held (a re-split: new)
        if found:
            batches, compute = sum(int(f[0]) for f in found), sum(float(f[2]) for f in found)
            per_worker[name] = {"batches": batches, "compute_s": compute,
                                "ms_per_batch": 1e3 * compute / max(1, batches)}  # fmt: skip
    return {"ok": True, "wall_s": round(wall, 1), "accuracy": report["final_accuracy"],
            "accuracy_per_epoch": report["test_accuracy_per_epoch"], "batches": report["batches"],
            "samples_per_second": report["samples_per_second"],
            "partitions": [p["points"] for p in report["partitions"]], "workers": per_worker}  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rootfs", type=Path, default=Path("/var/tmp/edgeagent-arm64"))
    p.add_argument("--mirror", default="http://deb.debian.org/debian")
    p.add_argument("--qemu-cpu", default="cortex-a72", help="qemu's CPU model (cortex-a72: a Pi 4; max).")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--reps", type=int, default=20, help="Timed batches per interpreter (the fastest).")
    p.add_argument("--timeout", type=float, default=1800, help="Seconds a pipeline run may take.")
    p.add_argument("--time-model", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    p.add_argument("--probe-threads", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    if args.time_model is not None:
        print(json.dumps(time_model(args.time_model, args.reps)))
        return 0
    if args.probe_threads:
        probe_threads()
        return 0
    if os.geteuid() != 0:
        raise SystemExit("chroot, mounts and binfmt_misc need root: sudo .venv/bin/python " + __file__)
    ensure_binfmt()
    rootfs = args.rootfs.resolve()
    ensure_rootfs(rootfs, args.mirror)
    ensure_site(rootfs)
    me = ["bench/arm_worker.py", "--reps", str(args.reps)]
    with mounted(rootfs), tempfile.TemporaryDirectory(prefix="arm-worker-") as tmp:
        x86_done = run([sys.executable, *me, "--time-model", "1"], cwd=ROOT, capture_output=True)
        x86 = json.loads(x86_done.stdout)
        arm_argv = arm_command(rootfs, args.qemu_cpu, ["/opt/edgeagent/bench/arm_worker.py", "--reps",
                                                       str(args.reps), "--time-model", "1"])  # fmt: skip
        arm_done = subprocess.run(arm_argv, capture_output=True, text=True, check=False)
        if arm_done.returncode != 0:
            print(f"the aarch64 torch failed (exit {arm_done.returncode}): {arm_done.stderr[-2000:]}")
            return 1
        arm = json.loads(arm_done.stdout.strip().splitlines()[-1])
        probe = subprocess.run(arm_command(rootfs, args.qemu_cpu, ["/opt/edgeagent/bench/arm_worker.py",
                                                                   "--probe-threads"]),
                               capture_output=True, text=True, check=False)  # fmt: skip
        threads_note = (
            "ok"
            if probe.returncode == 0
            else f"exit {probe.returncode}" + (" (SIGILL)" if probe.returncode in (-4, 132) else "")
        )
        broker, mosquitto = broker_url()
        try:
            edgeagent = [str(VENV_BIN / "edgeagent")]
            base = pipeline({"x86-1": edgeagent, "x86-2": edgeagent}, broker, args.epochs,
                            Path(tmp) / "x86.json", args.timeout)  # fmt: skip
            mixed = pipeline(
                {"x86-1": edgeagent, "arm64-1": arm_command(rootfs, args.qemu_cpu, ["-m", "edgeagent"])},
                broker, args.epochs, Path(tmp) / "arm.json", args.timeout,
            )  # fmt: skip
            arm_log = (Path(tmp) / "arm-arm64-1.log").read_text()[-3000:] if not mixed["ok"] else ""
        finally:
            if mosquitto is not None:
                mosquitto.terminate()
                mosquitto.wait()
    print()
    print(f"aarch64: qemu-aarch64-static -cpu {args.qemu_cpu}, Debian bookworm arm64, torch {arm['torch']}")
    print(f"{'one batch of the digits MLP (fwd+bwd, 32, 1 thread)':<54}{'x86':>10}{'aarch64':>9}{'ratio':>8}")
    print(f"{'  ms per batch':<54}{x86['batch_ms']:>10.3f}{arm['batch_ms']:>9.3f}"
          f"{arm['batch_ms'] / x86['batch_ms']:>7.1f}x")  # fmt: skip
    print(f"{'  import torch, s':<54}{x86['import_s']:>10.2f}{arm['import_s']:>9.2f}"
          f"{arm['import_s'] / x86['import_s']:>7.1f}x")  # fmt: skip
    print(f"a 2-thread matmul on the emulated {args.qemu_cpu}: {threads_note}")
    for name, result in (("x86 + x86", base), ("x86 + aarch64", mixed)):
        if not result["ok"]:
            print(f"pipeline {name}: FAILED: {result['error']}\n{arm_log}")
            continue
        workers = ", ".join(f"{w} {v['ms_per_batch']:.1f} ms/batch compute over {v['batches']} batches"
                            for w, v in result["workers"].items())  # type: ignore[attr-defined]  # fmt: skip
        print(f"pipeline {name}: accuracy {result['accuracy']:.3f} after {args.epochs} epochs "
              f"({result['batches']} batches, {result['samples_per_second']:.0f} samples/s, "
              f"{result['wall_s']} s), splits {result['partitions']}; {workers}")  # fmt: skip
    trained = bool(mixed["ok"]) and float(mixed["accuracy"]) > 0.8  # type: ignore[arg-type]
    print(f"aarch64 worker {'TRAINED' if trained else 'DID NOT TRAIN'} in the pipeline")
    return 0 if trained else 1


if __name__ == "__main__":
    sys.exit(main())
