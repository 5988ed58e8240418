"""The latency predictor warns on a device whose CPU kind it never learned from (a Pi's aarch64 against
the shipped x86-64 data) and says how to collect data there; silent on a kind it learned from."""

from __future__ import annotations

import functools
import logging

import pytest

import edgeagent.roles.worker.characterise as worker_characterise
from edgeagent.models import ModelSpec
from edgeagent.predictor import kinds
from edgeagent.predictor.measure import characterise
from edgeagent.predictor.store import shipped_provenance
from edgeagent.roles.worker.characterise import Characteriser

MOBILENET = ModelSpec("mobilenetv2", (1, 8, 8), 10)  # the model a predictor ships for


def _collection(platform: str) -> dict[str, object]:
    return {"machine": {"cpu": "x", "platform": platform}}


def test_the_kind_is_the_architecture_in_any_spelling() -> None:
    assert kinds.cpu_kind("x86_64") == kinds.cpu_kind("AMD64") == "x86_64"
    assert kinds.cpu_kind("aarch64") == kinds.cpu_kind("arm64") == "aarch64"
    assert kinds.cpu_kind("armv7l") == "armv7l"
    assert kinds.cpu_kind() == kinds.cpu_kind(__import__("platform").machine())


def test_the_kinds_learned_come_from_every_collections_machine() -> None:
    provenance = {
        "collections": [
            _collection("Linux-6.18.44-fc-v669-x86_64-with-glibc2.36"),
            _collection("Linux-6.6.31+rpt-rpi-v8-aarch64-with-glibc2.36"),
        ],
        "trained_on": {"platform": "Linux-6.1-riscv64-with-glibc2.36"},  # where it trained: not data
    }
    assert kinds.learned_kinds(provenance) == {"x86_64", "aarch64"}
    assert kinds.learned_kinds({"trained_on": {"platform": "Linux-6.1-x86_64-with"}}) == {"x86_64"}  # older
    assert kinds.learned_kinds({}) == set()


def test_the_shipped_predictor_learned_from_x86_only() -> None:
    provenance = shipped_provenance(MOBILENET)
    assert provenance is not None
    assert kinds.learned_kinds(provenance) == {"x86_64"}
    assert shipped_provenance(ModelSpec("mlp", (16,), 4)) is None  # no predictor ships for it


def test_the_warning_names_the_cpu_and_the_commands() -> None:
    provenance = {"collections": [_collection("Linux-6.1-x86_64-with-glibc2.36")]}
    common = {"model": "mobilenetv2", "in_shape": (1, 8, 8), "classes": 10}
    line = kinds.unlearned_kind_warning(provenance, **common, kind="aarch64", cpu="Cortex-A72")  # type: ignore[arg-type]
    assert line is not None and "\n" not in line
    assert "learned from x86_64 CPUs only; this device is aarch64 (Cortex-A72)" in line
    assert (
        "`sudo edgeagent predictor collect --model mobilenetv2 --in-shape 1x8x8 --classes 10 "
        "--out mobilenetv2-aarch64.json` then `edgeagent predictor train --data mobilenetv2-aarch64.json`"
    ) in line
    assert "--estimator capacity" in line
    assert kinds.unlearned_kind_warning(provenance, **common, kind="x86_64", cpu="EPYC") is None  # type: ignore[arg-type]
    assert kinds.unlearned_kind_warning({}, **common, kind="aarch64", cpu="A72") is None  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "warned"), [("aarch64", True), ("x86_64", False)])
def test_the_worker_warns_once_per_model_when_it_measures_h(
    kind: str, warned: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(worker_characterise, "cpu_kind", lambda: kind)
    monkeypatch.setattr(worker_characterise, "cpu_model", lambda: "Cortex-A72")
    monkeypatch.setattr(
        worker_characterise, "characterise", functools.partial(characterise, min_seconds=0.002)
    )
    characteriser = Characteriser("pi-1", budget=30.0, rounds=1)
    with caplog.at_level(logging.WARNING, logger=worker_characterise.__name__):
        for fresh in (False, True):  # measured twice: warned once
            characteriser.measure(MOBILENET.to_dict(), 4, slowdown=1.0, threads=1, fresh=fresh)
        mlp = ModelSpec("mlp", (16,), 4).to_dict()
        characteriser.measure(mlp, 4, slowdown=1.0, threads=1)  # no predictor ships for it: silent
    lines = [r.getMessage() for r in caplog.records if "learned from" in r.getMessage()]
    assert len(lines) == (1 if warned else 0), caplog.text
    if warned:
        assert lines[0].startswith("pi-1: the latency predictor for mobilenetv2 learned from x86_64 CPUs")
        assert "this device is aarch64 (Cortex-A72)" in lines[0]
