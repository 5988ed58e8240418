"""``edgeagent predictor collect|train|evaluate``: AccEPT's latency predictor (papers/004 Sec. 3.2).

    edgeagent predictor collect --model mobilenetv2 --in-shape 1x8x8 --out data.json      (root: quotas)
    edgeagent predictor collect --set heldout ... --out heldout.json
    edgeagent predictor train --data data.json [--data more.json ...] [--variant features|paper] [--seed N]
        [--out FILE]
    edgeagent predictor evaluate --data data.json [--data more.json ...] --held-out heldout.json

``--data`` may be given once per machine the training data was measured on (the paper pre-trains on
three CPUs); every file must be of the same model.

``train`` writes the predictor where a run finds it (``edgeagent/predictor/weights/<model key>.pt``)
unless ``--out`` says otherwise; the data set's provenance goes into the file.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import torch

from edgeagent.models import ModelSpec
from edgeagent.ops.logs import setup_logging
from edgeagent.ops.signals import sigterm_unwinds
from edgeagent.predictor import collect as collection
from edgeagent.predictor.evaluate import evaluate, fewer_windows
from edgeagent.predictor.machine import machine_info
from edgeagent.predictor.measure import model_key
from edgeagent.predictor.net import STEPS, VARIANTS, LatencyPredictor
from edgeagent.predictor.store import load, samples_of, save, shipped_path


def _spec(model: str, in_shape: str, classes: int) -> ModelSpec:
    try:
        shape = tuple(int(v) for v in in_shape.lower().split("x"))
    except ValueError:
        raise click.BadParameter(f"{in_shape!r}: expected CxHxW, e.g. 1x8x8") from None
    return ModelSpec(model, shape, classes)


def _model_of(records: list[dict[str, object]], path: str) -> ModelSpec:
    if not records:
        raise click.ClickException(f"{path}: no records; run `edgeagent predictor collect` first")
    model = records[0]["model"]
    assert isinstance(model, dict)
    return ModelSpec.from_dict(model)


def _training(paths: tuple[str, ...]) -> tuple[ModelSpec, list[dict[str, Any]], list[dict[str, Any]]]:
    """The model, the records of every training file, in order, and each file's document; ClickException
    when a file is empty or of another model than the first."""
    records: list[dict[str, Any]] = []
    documents = []
    for path in paths:
        try:
            document = collection.load_document(path)
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        spec = _model_of(document["records"], path)
        key = document["records"][0]["model_key"]
        if records and key != records[0]["model_key"]:
            raise click.ClickException(
                f"{path}: measured model {key}, but {paths[0]} measured {records[0]['model_key']}: "
                "train a predictor per model"
            )
        records += document["records"]
        documents.append(document)
    return spec, records, documents


@click.group("predictor")
def predictor() -> None:
    """AccEPT's latency predictor: collect data, pre-train, evaluate (papers/004 Sec. 3.2, 4.2)."""


@predictor.command("collect")
@click.option("--model", default="mobilenetv2", show_default=True, help="Built-in model name.")
@click.option("--in-shape", default="1x8x8", show_default=True, help="One sample's shape (digits: 1x8x8).")
@click.option("--classes", default=10, show_default=True, type=int)
@click.option(
    "--set", "which", type=click.Choice(sorted(collection.SETS)), default="training", show_default=True
)
@click.option("--reps", default=2, show_default=True, type=int, help="Least timed runs per window.")
@click.option(
    "--rounds",
    default=collection.ROUNDS,
    show_default=True,
    type=click.IntRange(min=1, max=1000),
    help="Windows per sub-model, interleaved; the fastest is its time.",
)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The data set file.")
@click.option("--resume", is_flag=True, help="Keep the configurations already in --out.")
def collect_command(
    model: str, in_shape: str, classes: int, which: str, reps: int, rounds: int, out: str, resume: bool
) -> None:
    """Measure every sub-model under many resource configurations (one process each; root for quotas)."""
    setup_logging()  # a line per configuration (its time, its split-half agreement), formatted warnings
    spec = _spec(model, in_shape, classes)
    configs = collection.config_set(which)
    with sigterm_unwinds():  # a stopped collection stops its child and removes its cgroups
        summary = collection.collect(spec, configs, out, reps=reps, rounds=rounds, resume=resume)
    click.echo(
        f"{out}: {len(summary.collected)} configurations measured, {len(summary.reused)} kept, "
        f"{len(summary.skipped)} skipped, {len(summary.failed)} failed; {summary.samples} samples in "
        f"{summary.seconds:.0f} s"
    )
    if summary.noisy:
        noisy = ", ".join(f"{name} {share:.0%}" for name, share in summary.noisy.items())
        click.echo(
            f"noisy (windows agreeing within ±10 %, under {collection.NOISY:.0%}): {noisy}; a held-out set "
            "this noisy tests the machine, not a predictor: measure again on a quieter machine"
        )
    if summary.failed:  # as `python -m edgeagent.predictor.collect` does: a script or unit sees it
        raise SystemExit(1)


# Training data, once per machine (a collection is of one machine; the paper pre-trains on three CPUs).
_DATA = click.option(
    "--data",
    required=True,
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="A collected training data set; once per machine, the same files for train and evaluate.",
)


@predictor.command("train")
@_DATA
@click.option("--variant", type=click.Choice(list(VARIANTS)), default="features", show_default=True)
@click.option("--steps", type=click.IntRange(min=1), help="Default: features 8000, paper 3000.")
@click.option(
    "--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Seeds the networks' weights."
)
@click.option("--out", type=click.Path(dir_okay=False), help="Default: where runs look for it.")
def train_command(data: tuple[str, ...], variant: str, steps: int | None, seed: int, out: str | None) -> None:
    """Pre-train a predictor on collected data sets (one or more machines)."""
    torch.set_num_threads(1)  # tiny networks: a second thread only adds contention
    spec, records, documents = _training(data)
    started = time.perf_counter()
    samples = samples_of(records)
    trained = LatencyPredictor.fit(samples, records[0]["flops"], variant=variant, steps=steps, seed=seed)  # type: ignore[arg-type]
    path = Path(out) if out else shipped_path(spec)
    provenance: dict[str, Any] = {
        "data": [Path(d).name for d in data],
        "samples": len(samples),
        "configs": len(records),
        "variant": variant,
        "steps": STEPS[variant] if steps is None else steps,  # type: ignore[index]
        "seed": seed,
        # training is repeatable on one machine, not across CPU kinds (its floating-point kernels differ)
        "trained_on": machine_info(),
        "collections": [d.get("provenance", {}) for d in documents],
    }
    save(trained, path, model=spec, provenance=provenance)
    click.echo(
        f"{path}: {variant} predictor for {spec.name} (key {model_key(spec)}) on {len(samples)} samples "
        f"from {len(records)} configurations in {time.perf_counter() - started:.1f} s"
    )


@predictor.command("evaluate")
@_DATA
@click.option("--held-out", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--weights", type=click.Path(exists=True, dir_okay=False), help="Default: the shipped one.")
@click.option(
    "--adapt-steps",
    default=300,
    show_default=True,
    type=click.IntRange(min=1),
    help="Training steps of the paper's adaptive update (predictor+k) per configuration and k.",
)
def evaluate_command(data: tuple[str, ...], held_out: str, weights: str | None, adapt_steps: int) -> None:
    """Share of sub-models within ±5 % / ±10 % on held-out configurations, against the baselines, every
    method on the sub-models no method measured (not a single layer, a representative or a tile)."""
    torch.set_num_threads(1)
    spec, training, _documents = _training(data)
    trained, _header = load(Path(weights) if weights else shipped_path(spec))
    records = collection.load_records(held_out)
    scores, rows = evaluate(trained, records, training, adapt_steps=adapt_steps)
    for row in rows:
        shares = ", ".join(
            f"{m} {v[0]:.0%}/{v[1]:.0%}" for m, v in row.items() if m not in ("config", "misses")
        )
        click.echo(f"{row['config']}: {shares}")
        for method, count in row["misses"].items():
            click.echo(
                f"  {method} missed ±10 % on {count['missed']} of {count['tested']} sub-models, "
                f"{count['missed inside one tile']} of them inside one tile; would miss "
                f"{count['single layers missed']} of the {count['single layers']} single layers (scored for "
                "no method: the look-up table's inputs)"
            )
    click.echo("mean (within ±5 % / ±10 %):")
    for method, (five, ten) in scores.mean().items():
        click.echo(f"  {method:14s} {five:6.1%} {ten:6.1%}")
    device = {k: fewer_windows(trained, records, k).mean() for k in (1, 2, 4)}
    if any(device.values()):
        click.echo("as a device measures (inputs from k windows each, tested on other windows), ±10 %:")
    for k, table in device.items():
        if table:
            click.echo(
                f"  k={k}: "
                + ", ".join(f"{m} {table[m][1]:.1%}" for m in ("linear+8", "blended+8", "lookup-table"))
            )
