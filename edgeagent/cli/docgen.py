"""The configuration reference, generated from the typed models: ``python -m edgeagent.cli.docgen``.

Writes ``docs/configuration.md`` (every key of central.yaml, its ``train:`` section, worker.yaml,
demo.yaml's ``demo:`` section and device profiles: type, default, flag, environment variable, help) and
a JSON Schema per file in ``docs/schema/`` for editors. A key's help is its model field's description,
else its flag's help (:mod:`edgeagent.cli.train_flags`, :mod:`edgeagent.cli.worker_flags`), else
:data:`MORE_HELP`; tests/unit/test_docgen.py fails when the checked-in files differ from what this writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from edgeagent.cli.flags import Flag, envvar
from edgeagent.cli.worker_flags import worker_groups
from edgeagent.config import CentralConfig, DemoConfig, TrainConfig, WorkerConfig
from edgeagent.mode_names import applies_to, mode_keys
from edgeagent.ops.profiles import DeviceProfile

# Keys that have neither a field description nor a flag.
MORE_HELP: dict[str, str] = {
    "model_options": "Keyword arguments of the model's constructor, e.g. {width_mult: 0.5}.",
    "test_fraction": "Share of the data set held out for evaluation.",
    "eval_batch_size": "Samples per evaluation batch.",
    "weight_decay": "SGD weight decay.",
    "aggregation_interval": "staleness aggregate: batches between FTPipeHD's weight aggregations.",
    "divergence": "A diverged run (loss not finite or above chance's): stop with one line, or warn.",
    "link_mbps": "Emulated uplink in Mbit/s (0: the real link).",
    "startup_timeout": "Seconds to wait for the workers before the run starts.",
    "home_assistant_prefix": "Topic prefix of Home Assistant's MQTT discovery.",
    "progress": "Show a progress bar.",
    "train": "What to train and how: the `train:` table below.",
    "broker": "An external broker's URL (none: the demo starts its own).",
    "id": "Device id (the file's name, and the worker's device_id).",
    "role": "Always worker.",
    "compression": "k-bit activations with 8-bit gradients (AccEPT); adaptive; auto (bits from the links).",
    "slowdowns": "Compute slowdown per device, central first, e.g. [1, 1, 6].",
    "workers": "Workers (the demo: local worker processes to start).",
    "metrics_interval": "Seconds between metrics messages (0: none).",
    "heartbeat_interval": "Seconds between heartbeats.",
    "threads": "Torch threads.",
    "memory_limit_mb": "Memory the stage may use here (0: no limit).",
}

# (title, the file it describes, model, file stem of its schema, the command whose flags set its keys)
SECTIONS: list[tuple[str, str, type[BaseModel], str, str | None]] = [
    ("central.yaml", "`edgeagent central --config`; also the top of demo.yaml", CentralConfig, "central",
     "central"),
    ("train:", "the `train:` section of central.yaml and demo.yaml", TrainConfig, "train", "central"),
    ("worker.yaml", "`edgeagent worker --config`", WorkerConfig, "worker", "worker"),
    ("demo:", "the `demo:` section of demo.yaml (`edgeagent demo --config`)", DemoConfig, "demo", None),
    ("device profiles", "configs/devices/<id>.yaml, pushed by `edgeagent profile push`", DeviceProfile,
     "profile", None),
]  # fmt: skip


def _flags(command: str | None) -> dict[str, Flag]:
    if command is None:
        return {}
    from edgeagent.cli.train import CENTRAL_GROUPS, DEMO_GROUPS  # with the commands' own flags

    groups = {"worker": worker_groups(), "central": CENTRAL_GROUPS, "demo": DEMO_GROUPS}[command]
    return {f.key: f for g in groups for f in g.flags if f.model is not None}


def key_help(model: type[BaseModel], key: str, flag: Flag | None) -> str:
    description = model.model_fields[key].description
    text = (description[0].upper() + description[1:]) if description else None
    text = text or (flag.help if flag else None) or MORE_HELP.get(key, "")
    modes = mode_keys().get(key) if model is CentralConfig else None
    if modes:
        text += f" ({applies_to(modes)})"
    return text


def _type(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " \\| ".join(map(str, prop["enum"]))
    if "$ref" in prop:
        return "mapping (below)"
    if "anyOf" in prop:
        return " or ".join(_type(p) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if kind == "object":
        return "mapping"
    bounds = [f"{s} {prop[k]}" for k, s in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                                            ("exclusiveMaximum", "<")) if k in prop]  # fmt: skip
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _default(model: type[BaseModel], key: str) -> str:
    info = model.model_fields[key]
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(below)"
    return f"`{json.dumps(value)}`"


def _schema(model: type[BaseModel], command: str | None) -> dict[str, Any]:
    flags = _flags(command)
    schema = model.model_json_schema()
    for key, prop in schema["properties"].items():
        if "$ref" not in prop:
            prop["description"] = key_help(model, key, flags.get(key))
    for name, sub in schema.get("$defs", {}).items():
        if name == TrainConfig.__name__:
            for key, prop in sub["properties"].items():
                prop["description"] = key_help(TrainConfig, key, flags.get(key))
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def schemas() -> dict[str, str]:
    """docs/schema/<stem>.json -> its text."""
    out = {}
    for _, _, model, stem, command in SECTIONS:
        if model is TrainConfig:
            continue  # inside central.json
        schema = _schema(model, command)
        if model is DemoConfig:  # demo.yaml: central.yaml's keys and a demo: section
            demo = schema
            schema = _schema(CentralConfig, "demo")
            demo["properties"].pop("central")
            demo.pop("$defs", None)
            schema["properties"]["demo"] = {k: v for k, v in demo.items() if k != "$schema"}
        out[f"{stem}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def markdown() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m edgeagent.cli.docgen` from edgeagent/config.py and",
        "     edgeagent/ops/profiles.py; tests/unit/test_docgen.py fails when this file is out of date. -->",
        "",
        "Every key of every configuration file, from the typed models that validate them. A flag overrides",
        "its key, and so does the environment variable `EDGEAGENT_<KEY>`: flag > environment > YAML >",
        "default. `edgeagent central --print-config` (and `demo`, `worker`) prints the merged result.",
        "A key marked *--mode X only* is refused under another mode unless it has its default.",
        "Editors: JSON Schemas in [schema/](schema/) (central.json, demo.json, worker.json, profile.json).",
        "",
    ]
    for title, where, model, _, command in SECTIONS:
        flags = _flags(command)
        props = model.model_json_schema()["properties"]
        lines += [f"## {title}", "", f"{where.capitalize() if where[0] != '`' else where}.", ""]
        lines += ["| key | type | default | flag | help |", "|---|---|---|---|---|"]
        for key in model.model_fields:
            if model is DemoConfig and key == "central":
                continue
            flag = flags.get(key)
            shown = flag is not None and not flag.kwargs.get("hidden")
            spelled = f"`{flag.decls[0].split('/')[0]}`" if flag and shown else ""
            env = f"<br>`{envvar(key)}`" if flag and shown else ""
            help_text = key_help(model, key, flag).replace("|", "\\|")
            lines.append(
                f"| `{key}` | {_type(props[key])} | {_default(model, key)} | {spelled}{env} | {help_text} |"
            )
        lines.append("")
    return "\n".join(lines)


def outputs(root: Path) -> dict[Path, str]:
    """Every generated file under ``root`` (the repository) -> its text."""
    out = {root / "docs" / "configuration.md": markdown()}
    out.update({root / "docs" / "schema" / name: text for name, text in schemas().items()})
    return out


def main(argv: list[str] | None = None) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parents[2])
    for path, text in outputs(root).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
