"""``edgeagent report FILE.json``: draw a run's plots again from the report ``--report`` wrote."""

from __future__ import annotations

import json
from pathlib import Path

import click

from edgeagent.errors import ConfigError
from edgeagent.ops.logs import console

__all__ = ["report"]


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def report(file: Path) -> None:
    """Re-plot the report FILE.json of a run (the PNGs beside it, as `--report` writes them)."""
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file}: not a JSON report: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: not a run report (a JSON object)")
    from edgeagent.ops.report import write_plots  # matplotlib: only when plotting

    plots = write_plots(data, file)
    console.print("plots: " + ", ".join(str(p) for p in plots))
