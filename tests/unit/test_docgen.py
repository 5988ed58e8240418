"""docs/configuration.md and docs/schema/*.json are what `python -m edgeagent.cli.docgen` writes from the
typed models: a key added, renamed or given another default without regenerating them fails here."""

from __future__ import annotations

import json
from pathlib import Path

from edgeagent.cli import docgen
from edgeagent.config import CentralConfig, TrainConfig, WorkerConfig
from edgeagent.ops.profiles import DeviceProfile

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_reference_matches_the_code() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, text in docgen.outputs(ROOT).items()
        if not path.is_file() or path.read_text() != text
    ]
    assert stale == [], f"out of date: {stale}; run `python -m edgeagent.cli.docgen`"


def test_every_key_is_documented_with_help() -> None:
    text = docgen.markdown()
    for model in (CentralConfig, TrainConfig, WorkerConfig, DeviceProfile):
        for key in model.model_fields:
            assert f"| `{key}` |" in text, key
    assert [line for line in text.splitlines() if line.endswith("|  |")] == []  # no empty help
    assert "| `collective` | ft-tree" in text and "(--mode allreduce only)" in text


def test_schemas_are_json_schemas_with_descriptions() -> None:
    central = json.loads(docgen.schemas()["central.json"])
    assert central["additionalProperties"] is False
    assert central["properties"]["collective"]["enum"][0] == "ft-tree"
    assert all("description" in p for p in central["$defs"]["TrainConfig"]["properties"].values())
    demo = json.loads(docgen.schemas()["demo.json"])
    assert "workers" in demo["properties"]["demo"]["properties"] and "mode" in demo["properties"]
