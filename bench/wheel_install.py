"""A worker's install from the built wheel, in a fresh venv: what it pulls in, and that the CLI works.

Builds the wheel (``pip wheel . --no-deps``), lists what it ships (no benchmark data), makes a fresh venv,
installs torch==2.13.0 first (any other torch requirement pulls GB of CUDA wheels) and then
``edgeagent-*.whl[worker]``, and checks:

* none of scikit-learn, scipy, matplotlib, amqtt, cryptography, pwdlib is installed;
* ``edgeagent --help``, ``edgeagent worker --help`` work, and ``--help`` takes under half the time of
  ``python -c "import torch"`` in that venv (median of ``--runs`` fresh processes);
* the digits data set loads and the worker's modules import; a command that needs an extra says which.

    .venv/bin/python bench/wheel_install.py [--keep DIR] [--runs 5]

A bench, not a test: the venv and torch's install take 1-2 minutes here, more than CI may spend on it.
The last line says whether every check held (exit status 0) or which did not.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from cli_startup import median_seconds  # noqa: E402

TORCH = "torch==2.13.0"
ABSENT = ("scikit-learn", "scipy", "matplotlib", "amqtt", "cryptography", "pwdlib")
# What a wheel may ship besides Python modules; anything else (benchmark JSON) fails the check.
SHIPPED = ("py.typed", ".pt", ".npz", ".yaml", ".service", ".target", ".timer", ".conf", ".txt", ".md")


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}"
        )
    return proc


def build_wheel(out: Path) -> Path:
    run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(out)])
    (wheel,) = out.glob("edgeagent-*.whl")
    return wheel


def wheel_files(wheel: Path) -> tuple[list[str], list[str]]:
    """(data files the wheel ships, of them those that are not expected)."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith(".py") and ".dist-info/" not in n]
    return names, [n for n in names if not n.endswith(SHIPPED)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--keep", type=Path, help="Make the venv here and keep it (default: a temporary one)."
    )
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    checks: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="edgeagent-wheel-") as tmp:
        started = time.perf_counter()
        wheel = build_wheel(Path(tmp) / "dist")
        names, unexpected = wheel_files(wheel)
        print(f"{wheel.name}: {wheel.stat().st_size / 1e6:.2f} MB; data files: {', '.join(names)}")
        checks["no benchmark data in the wheel"] = not unexpected
        if unexpected:
            print(f"  unexpected: {unexpected}")
        venv = args.keep or Path(tmp) / "venv"
        run([sys.executable, "-m", "venv", "--clear", str(venv)])
        bin_ = venv / "bin"
        run([str(bin_ / "pip"), "install", "-q", TORCH])
        run([str(bin_ / "pip"), "install", "-q", f"{wheel}[worker]"])
        print(f"venv with {TORCH} and {wheel.name}[worker] in {time.perf_counter() - started:.0f} s")
        listed = run([str(bin_ / "pip"), "list", "--format=freeze"]).stdout.lower().split()
        installed = sorted(line.split("==")[0] for line in listed)
        print(f"installed: {', '.join(installed)}")
        present = [name for name in ABSENT if name in installed]
        checks[f"none of {', '.join(ABSENT)}"] = not present
        if present:
            print(f"  present: {present}")
        python, edgeagent = str(bin_ / "python"), str(bin_ / "edgeagent")
        for helps in (["--help"], ["worker", "--help"], ["certs", "--help"]):
            checks[f"edgeagent {' '.join(helps)}"] = (
                subprocess.run([edgeagent, *helps], capture_output=True).returncode == 0
            )
        code = (
            "from edgeagent.data import load_dataset; import edgeagent.roles.worker, edgeagent.cli.train\n"
            "ds = load_dataset('digits'); print(len(ds.x_train) + len(ds.x_test))"
        )
        checks["digits load, the worker imports"] = run([python, "-c", code]).stdout.split() == ["1797"]
        site = str(Path(tmp) / "site")
        certs = subprocess.run([edgeagent, "certs", "--certs-dir", site], capture_output=True, text=True)
        print(f"edgeagent certs (needs [central]): exit {certs.returncode}: {certs.stderr.strip()}")
        checks["certs names the extra to install"] = (
            certs.returncode == 2 and "edgeagent[central]" in certs.stderr
        )
        help_s = median_seconds([edgeagent, "--help"], args.runs)
        torch_s = median_seconds([python, "-c", "import torch"], args.runs)
        ratio = help_s / torch_s
        print(f"edgeagent --help {help_s:.3f} s, import torch {torch_s:.3f} s: {ratio:.2f}x", end=" ")
        print(f"(median of {args.runs})")
        checks["edgeagent --help < 0.5x import torch"] = ratio < 0.5
    for name, held in checks.items():
        print(f"  {'ok  ' if held else 'FAIL'} {name}")
    failed = [name for name, held in checks.items() if not held]
    print("every check held" if not failed else f"failed: {'; '.join(failed)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
