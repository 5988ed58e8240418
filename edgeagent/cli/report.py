"""``edgeagent report FILE.json [--compare OTHER.json]``: draw a run's plots again from the report
``--report`` wrote, or set two runs side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from edgeagent.errors import ConfigError
from edgeagent.ops.logs import console

__all__ = ["report"]

_JSON_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def _read(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file}: not a JSON report: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: not a run report (a JSON object)")
    return data


def _names(a: Path, b: Path) -> tuple[str, str]:
    """Short names for the two runs: their file stems, or their paths when the stems are the same."""
    return (a.stem, b.stem) if a.stem != b.stem else (str(a), str(b))


@click.command()
@click.argument("file", type=_JSON_FILE)
@click.option(
    "--compare",
    "other",
    type=_JSON_FILE,
    default=None,
    metavar="OTHER.json",
    help="set this run's report beside FILE's: loss, accuracy and samples/s of both on shared axes "
    "(FILE-vs-OTHER.png beside FILE) and a table of their headline figures",
)
def report(file: Path, other: Path | None) -> None:
    """Re-plot the report FILE.json of a run (the PNGs beside it, as `--report` writes them), or compare it
    with another run's (--compare)."""
    data = _read(file)
    if other is None:
        from edgeagent.ops.report import write_plots  # matplotlib: only when plotting

        plots = write_plots(data, file)
        console.print("plots: " + ", ".join(str(p) for p in plots))
        return
    from rich.table import Table

    from edgeagent.ops.report.compare import compare_path, compare_table, plot_compare

    second = _read(other)
    names = _names(file, other)
    head, *rows = compare_table(data, second, names)
    table = Table(*head, box=None, pad_edge=False)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(f"plot: {plot_compare(data, second, names, compare_path(file, other))}")
