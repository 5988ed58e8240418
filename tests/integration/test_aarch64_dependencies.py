"""A worker's dependencies resolve to wheels on a 64-bit Raspberry Pi (aarch64, CPython 3.11).

pip resolves the package's base dependencies and its ``[worker]`` extra, read from pyproject.toml now
(not a copy), for the aarch64 manylinux tags a Pi's glibc accepts (Raspberry Pi OS bookworm: 2.36),
binary wheels only, without installing or downloading a wheel where the index serves its metadata apart
(PEP 658). A dependency that has no aarch64 wheel (it would compile on the Pi, or fail) fails here. The
test needs the package index: it skips, saying so, when it cannot reach it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "3.11"  # Raspberry Pi OS bookworm's python3
PI_GLIBC = 36  # Raspberry Pi OS bookworm: glibc 2.36
# Explicit: this pip does not widen a manylinux_2_28 platform to the older tags a wheel may carry.
PLATFORMS = [f"manylinux_2_{minor}_aarch64" for minor in range(PI_GLIBC, 16, -1)] + ["manylinux2014_aarch64"]
INDEX = "https://pypi.org/simple/"
# What says "the index could not be reached", in pip's output.
UNREACHABLE = (
    "NewConnectionError", "Name or service not known", "Temporary failure in name resolution",
    "Max retries exceeded", "ConnectTimeoutError", "Network is unreachable", "ProxyError",
)  # fmt: skip


def worker_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project.get("optional-dependencies", {}).get("worker", [])]


def _index_unreachable() -> str | None:
    url = urlparse(os.environ.get("PIP_INDEX_URL") or INDEX)
    host, port = url.hostname or "pypi.org", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        return f"the package index {host}:{port} is unreachable ({exc})"
    return None


@pytest.mark.timeout(180)
def test_the_worker_dependencies_resolve_to_aarch64_wheels() -> None:
    reason = _index_unreachable()
    if reason:
        pytest.skip(reason)
    requirements = worker_requirements()
    assert any(r.startswith("torch") for r in requirements), requirements
    with tempfile.TemporaryDirectory() as target:
        cmd = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
            "--ignore-installed", "--only-binary=:all:", "--python-version", PYTHON,
            "--implementation", "cp", "--target", target, "--retries", "1", "--timeout", "20",
            "--disable-pip-version-check",
            *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
            *requirements,
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=170, check=False)
    if done.returncode != 0 and any(word in done.stderr for word in UNREACHABLE):
        pytest.skip(f"the package index went away while resolving: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, f"no aarch64 resolution for {requirements}:\n{done.stderr[-3000:]}"
    report = json.loads(done.stdout)
    installs = report["install"]
    files: dict[str, str] = {
        canonicalize_name(item["metadata"]["name"]): item["download_info"]["url"] for item in installs
    }
    names = {canonicalize_name(Requirement(r).name) for r in requirements}
    assert names <= set(files), f"not in the resolution: {sorted(names - set(files))}"
    for name, url in files.items():
        wheel = url.rsplit("/", 1)[-1]
        assert wheel.endswith(".whl"), f"{name}: {wheel} is not a wheel"
        tags = wheel[: -len(".whl")].split("-")[-1]
        assert tags == "any" or "aarch64" in tags, f"{name}: {wheel} is not for aarch64"
    assert "aarch64" in files["torch"], files["torch"]
    # What only the central node and the broker use stays out of a Pi's install.
    heavy = {"scikit-learn", "scipy", "matplotlib", "amqtt"} & set(files)
    assert not heavy, f"a worker's install pulls {sorted(heavy)}"
