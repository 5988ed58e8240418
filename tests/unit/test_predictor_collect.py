"""Tests for edgeagent.predictor.collect: configurations, the data set's validation, the child's command
and the collection loop's skip, failure and resume paths (children faked). The real children are in
tests/integration/test_predictor_collect_processes.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgeagent.models import ModelSpec
from edgeagent.predictor import collect as collect_mod
from edgeagent.predictor.collect import (
    ResourceConfig,
    Timing,
    collect,
    config_name,
    config_set,
    dumps_document,
    held_out_configs,
    load_document,
    load_records,
    parse_cpus,
    training_configs,
)
from edgeagent.predictor.configs import held_out_full_configs, held_out_isa_configs
from edgeagent.predictor.measure import model_key
from edgeagent.predictor.submodels import all_ranges, representative

TINY = ModelSpec("mlp", (16,), 4, (("hidden", (8, 8)),))  # 3 layers, 6 sub-models


def fake_record(
    cfg: ResourceConfig, spec: ModelSpec = TINY, reps: int = 1, rounds: int = collect_mod.ROUNDS
) -> dict[str, Any]:
    ranges = all_ranges(3)
    return {
        "config": cfg.to_dict(),
        "model": spec.to_dict(),
        "model_key": model_key(spec),
        "batch_size": cfg.batch_size,
        "num_layers": 3,
        "flops": [2048.0, 1536.0, 768.0],
        "h": [1e-4 * (k + 1) for k in range(10)],
        "ranges": [list(r) for r in ranges],
        "seconds": [1e-4 * (e - s) for s, e in ranges],
        "reps": reps,
        "rounds": rounds,
        "round_seconds": [[1e-4 * (e - s)] * rounds for s, e in ranges],
        "torch": "2.x",
        "host": "test",
        "cpu": "test cpu",
        "measured_at": "2026-01-01T00:00:00+00:00",
    }


# -- configurations ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": ""}, "config name"),
        ({"name": "a/b"}, "config name"),
        ({"threads": 0}, r"threads must be an int in 1\.\.256, got 0"),
        ({"threads": True}, "threads"),
        ({"cpu_quota": 0.05}, r"cpu_quota \(cores\) must be a number in 0\.1\.\.1024\.0, got 0\.05"),
        ({"cpu_quota": float("nan")}, "cpu_quota"),
        ({"cpus": "0-"}, "taskset list"),
        ({"cpus": "3-1"}, r"runs backwards \(3 > 1\)"),
        ({"batch_size": -4}, r"batch_size must be an int in 1\.\.65536, got -4"),
        ({"slowdown": 0.5}, r"slowdown must be a number in 1\.0\.\.1000\.0, got 0\.5"),
        ({"isa": "avx512"}, r"isa must be one of \['avx2', 'sse'\] or None, got 'avx512'"),
    ],
)
def test_invalid_configs_raise_with_the_numbers(changes: dict[str, Any], message: str) -> None:
    good = {"name": "x", "threads": 1, "cpu_quota": None, "cpus": None, "batch_size": 32, "slowdown": 1.0}
    with pytest.raises(ValueError, match=message):
        ResourceConfig(**{**good, **changes})


def test_round_trip_through_json() -> None:
    for cfg in [*training_configs(), *held_out_configs(), *held_out_isa_configs(), *held_out_full_configs()]:
        assert ResourceConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_a_record_from_before_the_isa_runs_on_the_machines_own() -> None:
    d = ResourceConfig.named(1).to_dict()
    del d["isa"]
    assert ResourceConfig.from_dict(d) == ResourceConfig.named(1)
    assert ResourceConfig.from_dict(d).isa is None


def test_from_dict_names_missing_and_unknown_keys() -> None:
    d = ResourceConfig.named(1).to_dict()
    del d["threads"]
    d["cores"] = 2
    with pytest.raises(ValueError, match=r"missing keys \['threads'\], unknown keys \['cores'\]"):
        ResourceConfig.from_dict(d)


def test_names_and_cpus() -> None:
    assert config_name(2, 0.5, None, 32, 1.0) == "t2-q0.50-b32-s1"
    assert config_name(1, None, "0,2-3", 16, 2.5) == "t1-cpu0+2-3-b16-s2.5"
    assert config_name(2, 1.0, None, 64, 1.0, "avx2") == "t2-q1.00-b64-s1-avx2"
    assert parse_cpus("0,2-3") == [0, 2, 3]


def test_training_and_held_out_sets() -> None:
    training, held_out, held_out_isa = training_configs(), held_out_configs(), held_out_isa_configs()
    held_out_full = held_out_full_configs()
    assert 16 <= len(training) <= 40
    assert len(held_out) == 4 and len(held_out_isa) == 2 and len(held_out_full) == 4
    names = [c.name for c in [*training, *held_out, *held_out_isa, *held_out_full]]
    assert len(set(names)) == len(names)
    seen = {c.resources for c in training}
    assert not any(c.resources in seen for c in [*held_out, *held_out_isa, *held_out_full])
    assert {c.isa for c in held_out} == {None} and {c.isa for c in held_out_isa} == {"avx2", "sse"}
    # The full-speed set: no quota, no emulated CPU or slowdown, a batch size training never had.
    assert {(c.cpu_quota, c.isa, c.slowdown) for c in held_out_full} == {(None, None, 1)}
    assert {c.batch_size for c in held_out_full}.isdisjoint({c.batch_size for c in training})
    assert config_set("heldout-full") == held_out_full
    # Three kinds of CPU, as the paper's three: this machine's and two emulated ones.
    assert {c.isa for c in training} == {None, "avx2", "sse"}
    assert config_set("heldout-isa") == held_out_isa_configs()
    # The short set, for one more machine, is ten training rows on the machine's own CPU.
    short = config_set("training-short")
    assert len(short) == 10 and set(short) <= set(training) and {c.isa for c in short} == {None}
    with pytest.raises(ValueError, match="unknown configuration set 'held-out'"):
        config_set("held-out")
    # The dimensions the brief asks for are all there.
    assert {c.threads for c in training} == {1, 2}
    assert {c.batch_size for c in training} == {16, 32, 64}
    assert {c.slowdown for c in training} == {1, 2, 4}
    assert {0.25, 0.5, 0.75, 1.0, 1.5} <= {c.cpu_quota for c in training}
    assert any(c.cpus == "0" and c.threads == 2 for c in training)


# -- the data set on disk --------------------------------------------------------------------------------


def write_doc(path: Path, records: list[Any]) -> Path:
    path.write_text(dumps_document({"created_at": "now"}, records))
    return path


def test_document_round_trip(tmp_path: Path) -> None:
    records = [fake_record(ResourceConfig.named(1)), fake_record(ResourceConfig.named(2))]
    assert load_records(write_doc(tmp_path / "d.json", records)) == records
    assert load_records(write_doc(tmp_path / "e.json", [])) == []


def _broken(key: str, value: Any) -> dict[str, Any]:
    record = fake_record(ResourceConfig.named(1))
    record[key] = value
    return record


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not a JSON document"),
        ("[]", "must be an object, got list"),
        ('{"format": 2, "provenance": {}, "records": []}', "format must be 1, got 2"),
        ('{"format": 1, "records": []}', "provenance must be an object"),
        ('{"format": 1, "provenance": {}, "records": {}}', "records must be a list, got dict"),
        (dumps_document({}, [{"config": {}}]), r"record 0: missing keys \['model'"),
        (dumps_document({}, [_broken("h", [1.0] * 9)]), "record 0: h must be a list of 10 numbers, got 9"),
        (
            dumps_document({}, [_broken("seconds", [0.1] * 5 + [-1.0])]),
            r"seconds\[5\] must be a finite number > 0, got -1\.0",
        ),
        (dumps_document({}, [_broken("ranges", [[0, 1]])]), "ranges must be all 6 sub-models of 3 layers"),
        (dumps_document({}, [_broken("model_key", "x")]), "model_key 'x' is not the model's"),
        (dumps_document({}, [_broken("host", None)]), "host must be a string, got None"),
        (dumps_document({}, [_broken("batch_size", 8)]), "batch_size 8 is not the config's"),
        (
            dumps_document({}, [_broken("config", {**ResourceConfig.named(1).to_dict(), "threads": 0})]),
            "threads",
        ),
        (dumps_document({}, [fake_record(ResourceConfig.named(1))] * 2), "record 1: .* appears twice"),
    ],
)
def test_malformed_files_name_the_file_and_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        load_records(path)
    assert str(path) in str(info.value)


# -- the child entry point (one real run) ----------------------------------------------------------------


def test_command_wraps_taskset_and_cgroup(tmp_path: Path) -> None:
    cfg = ResourceConfig.named(2, cpu_quota=0.5, cpus="0")
    cmd = collect_mod.child_command(cfg, TINY, 1, tmp_path / "r.json", Path("/cg/x"))
    assert cmd[:7] == ["sh", "-c", collect_mod._JOIN, "/cg/x", "taskset", "-c", "0"]


# -- the collection loop (children faked) ----------------------------------------------------------------


@pytest.fixture
def no_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collect_mod, "cgroup_problem", lambda: "CPU quotas need root (test)")


@pytest.mark.usefixtures("no_cgroups")
def test_quota_skipped_failure_reported_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ok, bad, quota = ResourceConfig.named(1), ResourceConfig.named(2), ResourceConfig.named(1, cpu_quota=0.5)
    calls: list[str] = []

    def fake_measure(
        cfg: ResourceConfig, spec: ModelSpec, timing: collect_mod.Timing, *args: Any
    ) -> dict[str, Any]:
        calls.append(cfg.name)
        if cfg == bad:
            raise RuntimeError("exited with 1\nboom")
        return fake_record(cfg, reps=timing.reps, rounds=timing.rounds)

    monkeypatch.setattr(collect_mod, "_measure_one", fake_measure)
    out = tmp_path / "data.json"
    summary = collect(TINY, [ok, bad, quota], out, reps=1, progress=False)
    assert summary.collected == [ok.name]
    assert summary.failed == {bad.name: "exited with 1"}
    assert "needs a CPU quota of 0.5 cores, but CPU quotas need root" in summary.skipped[quota.name]
    assert [r["config"]["name"] for r in load_records(out)] == [ok.name]
    assert summary.samples == 6

    calls.clear()
    again = collect(TINY, [ok, bad], out, reps=1, progress=False, resume=True)
    assert calls == [bad.name] and again.reused == [ok.name]
    calls.clear()
    collect(TINY, [ok], out, reps=2, progress=False, resume=True)  # other reps: measured again
    assert calls == [ok.name]
    calls.clear()
    collect(TINY, [ok], out, reps=2, rounds=8, progress=False, resume=True)  # other rounds: again
    assert calls == [ok.name] and load_document(out)["provenance"]["rounds"] == 8
    calls.clear()
    assert collect(TINY, [ok], out, reps=2, rounds=8, progress=False, resume=True).reused == [ok.name]
    assert calls == []
    with pytest.raises(ValueError, match="cannot resume"):
        collect(ModelSpec("mlp", (8,), 4), [ok], out, reps=2, progress=False, resume=True)


@pytest.mark.usefixtures("no_cgroups")
def test_a_noisy_configuration_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    quiet, noisy = ResourceConfig.named(1), ResourceConfig.named(2)

    def fake_measure(cfg: ResourceConfig, _: ModelSpec, timing: Timing, *_a: Any) -> dict[str, Any]:
        record = fake_record(cfg, reps=timing.reps, rounds=timing.rounds)
        if cfg == noisy:  # the odd rounds' windows 20 % over the even rounds'
            record["round_seconds"] = [[t * (1 + 0.2 * (i % 2)) for i in range(4)] for t in record["seconds"]]
        return record

    monkeypatch.setattr(collect_mod, "_measure_one", fake_measure)
    summary = collect(TINY, [quiet, noisy], tmp_path / "d.json", reps=1, progress=False)
    assert summary.collected == [quiet.name, noisy.name]
    assert summary.noisy == {noisy.name: 0.0}
    assert f"{noisy.name} is noisy" in caplog.text and f"{quiet.name} is noisy" not in caplog.text
    assert [r["config"]["name"] for r in load_records(tmp_path / "d.json")] == [quiet.name, noisy.name]


def test_round_windows_are_checked_and_give_the_split_half_agreement() -> None:
    from edgeagent.predictor.evaluate import repeatability

    record = fake_record(ResourceConfig.named(1))
    collect_mod.check_record(record)
    assert repeatability(record) == (1.0, 1.0)  # every window equal
    noisy = dict(record, round_seconds=[[t, t * 1.2, t, t * 1.2] for t in record["seconds"]])
    assert repeatability(noisy) == (0.0, 0.0)  # the even rounds' time 20 % under the odd rounds'
    assert repeatability({k: v for k, v in record.items() if k != "round_seconds"}) is None
    with pytest.raises(ValueError, match="round_seconds must hold 6 lists"):
        collect_mod.check_record(dict(record, round_seconds=record["round_seconds"][:2]))
    with pytest.raises(ValueError, match=r"round_seconds\[0\] must be a list of 4 numbers"):
        collect_mod.check_record(dict(record, round_seconds=[[0.1]] * 6))


def test_an_instruction_set_the_cpu_lacks_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collect_mod.torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    cfg = ResourceConfig.named(1, batch_size=4, isa="avx2")
    with pytest.raises(RuntimeError, match=r"asked for the avx2 .* runs DEFAULT: this CPU lacks it"):
        collect_mod.measure_config(cfg, TINY, 1, rounds=1)


def test_the_shipped_data_sets_validate_and_hold_their_configurations_out_of_training() -> None:
    """Every data set under edgeagent/predictor/data loads (validated), names the command and machine that
    measured it, is of one model, and no held-out configuration was measured on that machine in training."""
    data = Path(collect_mod.__file__).resolve().parent / "data"
    training = [load_document(p) for p in sorted(data.glob("*.json")) if "heldout" not in p.name]
    assert len(training) >= 2
    key = training[0]["records"][0]["model_key"]
    trained = {(r["config"]["name"], r["cpu"]) for doc in training for r in doc["records"]}
    held_out = sorted(p for p in data.glob("*.json") if "heldout" in p.name)
    assert len(held_out) >= 5
    for doc in training:
        assert doc["provenance"]["command"] and {r["model_key"] for r in doc["records"]} == {key}
    for path in held_out:
        doc = load_document(path)
        assert doc["provenance"]["command"] and doc["provenance"]["machine"]["cpu"], path.name
        assert {r["model_key"] for r in doc["records"]} == {key}, path.name
        assert not {(r["config"]["name"], r["cpu"]) for r in doc["records"]} & trained, path.name


def test_train_and_evaluate_take_one_data_set_per_machine(tmp_path: Path) -> None:
    """``predictor train --data A --data B`` pre-trains on both machines' records (and says so in the
    weights' provenance); ``train`` and ``evaluate`` refuse, by name, a file of another model."""
    from click.testing import CliRunner

    from edgeagent.cli.main import main
    from edgeagent.predictor.store import load

    configs = [ResourceConfig.named(1), ResourceConfig.named(2)]
    first = write_doc(tmp_path / "one.json", [fake_record(c) for c in configs])
    second = write_doc(tmp_path / "two.json", [dict(fake_record(c), cpu="other cpu") for c in configs])
    weights = tmp_path / "w.pt"
    runner = CliRunner()
    args = ["predictor", "train", "--data", str(first), "--data", str(second), "--steps", "3"]
    result = runner.invoke(main, [*args, "--seed", "2", "--out", str(weights)])
    assert result.exit_code == 0, result.output
    assert "on 24 samples from 4 configurations" in result.output
    predictor, header = load(weights)
    assert len(predictor.data) == 24 and predictor.seed == 2
    assert header["provenance"]["data"] == ["one.json", "two.json"] and header["provenance"]["seed"] == 2
    assert [c["created_at"] for c in header["provenance"]["collections"]] == ["now", "now"]
    assert header["provenance"]["trained_on"]["cpu_id"]  # which machine's kernels made these weights
    args = ["predictor", "evaluate", "--data", str(first), "--held-out", str(first)]
    # 3 layers: every sub-model is a single layer, a tile or a representative
    result = runner.invoke(main, [*args, "--weights", str(weights)])
    assert result.exit_code != 0
    assert "the 3-layer model's 6 sub-models are all some method's inputs" in result.output
    other = ModelSpec("mlp", (16,), 4, (("hidden", (8, 4)),))
    odd = write_doc(tmp_path / "odd.json", [fake_record(configs[0], spec=other)])
    refused = f"{odd}: measured model {model_key(other)}, but {first} measured {model_key(TINY)}"
    for command in (["train"], ["evaluate", "--held-out", str(first)]):
        result = runner.invoke(main, ["predictor", *command, "--data", str(first), "--data", str(odd)])
        assert result.exit_code == 1 and refused in result.output, result.output


def _additive_record(cfg: ResourceConfig, spec: ModelSpec, layers: int) -> dict[str, Any]:
    """A record of ``spec`` (``layers`` layers) whose sub-models take the sum of their layers' times."""
    per_layer = [1e-4 * (j + 1) * cfg.threads for j in range(layers)]
    ranges = all_ranges(layers)
    seconds = [sum(per_layer[s:e]) for s, e in ranges]
    flops = [1000.0 * (j + 1) for j in range(layers)]
    times = dict(zip(ranges, seconds, strict=True))
    record = fake_record(cfg, spec)
    record.update(
        num_layers=layers,
        flops=flops,
        ranges=[list(r) for r in ranges],
        seconds=seconds,
        round_seconds=[[t] * record["rounds"] for t in seconds],
        h=[times[r] for r in representative(flops)],
    )
    return record


def test_evaluate_prints_every_method_and_the_misses(tmp_path: Path) -> None:
    """``predictor evaluate`` on a 5-layer model: per configuration every method's shares and blended+k's
    misses, then the means; the look-up table is exact on additive times."""
    from click.testing import CliRunner

    from edgeagent.cli.main import main

    spec = ModelSpec("mlp", (16,), 4, (("hidden", (8, 8, 8, 8)),))  # 5 layers, 15 sub-models
    data = write_doc(
        tmp_path / "d.json", [_additive_record(ResourceConfig.named(t), spec, 5) for t in (1, 2)]
    )
    weights = tmp_path / "w.pt"
    runner = CliRunner()
    result = runner.invoke(
        main, ["predictor", "train", "--data", str(data), "--steps", "3", "--out", str(weights)]
    )
    assert result.exit_code == 0, result.output
    args = ["predictor", "evaluate", "--data", str(data), "--held-out", str(data), "--weights", str(weights)]
    args += ["--adapt-steps", "5"]  # what is printed, not how well the update adapts
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("t")] == ["t1-b32-s1", "t2-b32-s1"]
    assert sum("blended+8 missed ±10 % on" in line for line in lines) == 2
    assert any(line.split() == ["lookup-table", "100.0%", "100.0%"] for line in lines)
    # 4 rounds: inputs from 1 or 2 windows against the other 2; the table exact on equal windows.
    device = [line.split(":")[0].strip() for line in lines if "lookup-table 100.0%" in line]
    assert device == ["k=1", "k=2"]


@pytest.fixture
def root_logging() -> Any:
    """The root logger's handlers and level as they were: a command's ``setup_logging`` replaces them."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("no_cgroups", "root_logging")
def test_the_collect_command_logs_each_configuration_and_fails_on_a_failed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``edgeagent predictor collect`` says how each configuration went as it goes (an hour-long collection
    was silent until its last line), and exits 1 when one failed, as ``python -m ...collect`` does."""
    from click.testing import CliRunner

    from edgeagent.cli.main import main

    spec = ModelSpec("mlp", (16,), 4)
    configs = [c for c in collect_mod.config_set("training-short") if c.cpu_quota is None]
    bad = configs[1]

    def fake_measure(cfg: ResourceConfig, _: ModelSpec, timing: Timing, *_a: Any) -> dict[str, Any]:
        if cfg == bad:
            raise RuntimeError("exited with 1\nboom")
        return fake_record(cfg, spec, reps=timing.reps, rounds=timing.rounds)

    monkeypatch.setattr(collect_mod, "_measure_one", fake_measure)
    args = ["predictor", "collect", "--model", "mlp", "--in-shape", "16", "--classes", "4"]
    args += ["--set", "training-short", "--out", str(tmp_path / "d.json")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    text = " ".join(result.stderr.split())  # rich wraps long lines
    for cfg in configs:
        if cfg != bad:
            assert f"{cfg.name}: 6 sub-models in" in text, cfg.name
    assert f"configuration {bad.name} failed, skipped: exited with 1" in text
    assert "skipping" in text and "CPU quotas need root (test)" in text
    assert f"{len(configs) - 1} configurations measured" in result.stdout and "1 failed" in result.stdout
