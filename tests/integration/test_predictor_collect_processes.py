"""``edgeagent.predictor.collect`` with real children: one real run of a tiny model's entry point, an
emulated instruction set, a failing child, and SIGTERM to a collection under a quota."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgeagent.models import ModelSpec
from edgeagent.ops import cgroups
from edgeagent.predictor import collect as collect_mod
from edgeagent.predictor.collect import ResourceConfig, collect, held_out_configs, load_records
from edgeagent.predictor.measure import model_key
from tests.conftest import first_pid_in, terminate_and_check_unwound
from tests.unit.test_predictor_collect import TINY


def test_child_entry_point_measures_every_sub_model(tmp_path: Path) -> None:
    cfg = ResourceConfig.named(1, batch_size=4)
    out = tmp_path / "record.json"
    cmd = collect_mod.child_command(cfg, TINY, 1, out, None, rounds=2)
    assert cmd[:3] == [sys.executable, "-m", "edgeagent.predictor.collect"]
    subprocess.run(cmd, check=True, timeout=60, env=collect_mod._child_env(cfg))
    record = json.loads(out.read_text())
    collect_mod.check_record(record)
    assert ResourceConfig.from_dict(record["config"]) == cfg
    assert ModelSpec.from_dict(record["model"]) == TINY
    assert record["model_key"] == model_key(TINY)
    assert record["ranges"] == [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]
    assert len(record["h"]) == 10 and all(x > 0 for x in record["h"])
    assert record["torch_threads"] == 1 and record["reps"] == 1 and record["rounds"] == 2
    assert all(len(w) == 2 for w in record["round_seconds"])
    assert record["cpu"] and record["host"] is not None and record["measured_at"]
    assert record["cpu_capability"]


def test_an_emulated_cpu_runs_its_instruction_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The parent's own setting must not leak into a configuration on the machine's own CPU.
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert "ATEN_CPU_CAPABILITY" not in collect_mod._child_env(ResourceConfig.named(1))
    cfg = ResourceConfig.named(1, batch_size=4, isa="sse")
    env = collect_mod._child_env(cfg)
    assert (env["ATEN_CPU_CAPABILITY"], env["ONEDNN_MAX_CPU_ISA"]) == ("default", "SSE41")
    out = tmp_path / "record.json"
    subprocess.run(
        collect_mod.child_command(cfg, TINY, 1, out, None, rounds=1), check=True, timeout=60, env=env
    )
    assert json.loads(out.read_text())["cpu_capability"] == "DEFAULT"


def test_child_failure_is_reported_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        collect_mod, "child_command", lambda *a, **k: [sys.executable, "-c", "import sys; sys.exit('boom')"]
    )
    monkeypatch.setattr(collect_mod, "cgroup_problem", lambda: "no cgroups in this test")
    summary = collect(TINY, [ResourceConfig.named(1)], tmp_path / "d.json", reps=1, progress=False)
    assert summary.failed == {"t1-b32-s1": "exited with 1"}
    assert load_records(tmp_path / "d.json") == []


@pytest.mark.skipif(collect_mod.cgroup_problem() is not None, reason=f"needs {collect_mod.cgroup_problem()}")
def test_a_terminated_collection_stops_its_child_and_removes_its_group(tmp_path: Path) -> None:
    """SIGTERM (kill, systemd, a timeout) to ``edgeagent predictor collect`` unwinds it as Ctrl-C does:
    the child measuring under a quota is killed and the cgroup removed, not left running on its own."""
    cfg = held_out_configs()[0]
    assert cfg.cpu_quota is not None  # the first held-out configuration runs in a group
    group = collect_mod.GROUP_ROOT / cfg.name
    cmd = [sys.executable, "-m", "edgeagent", "predictor", "collect", "--model", "mlp", "--in-shape", "16"]
    cmd += ["--classes", "4", "--set", "heldout", "--rounds", "1000", "--out", str(tmp_path / "data.json")]
    log = tmp_path / "collect.log"
    with log.open("wb") as err:
        parent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    try:
        terminate_and_check_unwound(parent, log, first_pid_in(group, parent))
        assert not group.exists()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        cgroups.remove_cgroups(group)  # kills a child left in it (the test failed), then removes it
        collect_mod.remove_groups([])  # the collections' root, unless another collection is in it
