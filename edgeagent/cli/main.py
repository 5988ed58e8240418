"""The ``edgeagent`` command: the group, its error boundary, and the commands of each module.

* :mod:`.train`: ``demo``, ``central``, ``worker``;
* :mod:`.broker`: ``broker``, ``credentials``, ``certs``;
* :mod:`.ops`: ``monitor``, ``profile``.
"""

from __future__ import annotations

import logging
import pickle
import sys
from typing import Any, NoReturn

import click

from edgeagent.cli.broker import broker, certs_command, credentials
from edgeagent.cli.ops import monitor, profile
from edgeagent.cli.predictor import predictor
from edgeagent.cli.train import central, demo, worker
from edgeagent.errors import EdgeAgentError, ProtocolError, TrainingError

log = logging.getLogger("edgeagent")


# Note: a user's mistake ends in one line, never a traceback.
#     Every command runs under ``_Cli.invoke``: an EdgeAgentError (whose message says what to change),
#     and the ValueError, KeyError and OSError that bad input raises from libraries (a model option of
#     the wrong type, a file that is not there), end as ``error: ...`` on stderr with exit status 2 (1
#     for a run that failed: TrainingError, ProtocolError). Anything else is a bug and keeps its
#     traceback. `--log-level DEBUG` logs the traceback of a caught error too.
_INPUT_ERRORS = (ValueError, KeyError, OSError, pickle.UnpicklingError)


def _message(exc: BaseException, command: str) -> str:
    """What went wrong, on one line, with what to change when the exception does not say it itself."""
    if isinstance(exc, OSError) and exc.filename is not None:
        target = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 else "")
        text = f"{target}: {exc.strerror or exc}; check the path and its permissions"
    elif isinstance(exc, KeyError):
        text = f"unknown or missing key {exc.args[0]!r} (see `{command} --help`)" if exc.args else repr(exc)
    else:
        text = str(exc) or type(exc).__name__
        if not isinstance(exc, EdgeAgentError):  # edgeagent's own errors carry their hint
            text += f" (see `{command} --help`)"
    return " ".join(text.split())  # one line, even for multi-line YAML or torch messages


def _fail(exc: BaseException, command: str = "edgeagent") -> NoReturn:
    log.debug("%s failed", command, exc_info=exc)
    click.echo(click.style("error:", fg="red", bold=True) + " " + _message(exc, command), err=True)
    sys.exit(1 if isinstance(exc, TrainingError | ProtocolError) else 2)


class _Cli(click.Group):
    """The ``edgeagent`` group: runs every subcommand under the one error boundary (see the Note)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (EdgeAgentError, *_INPUT_ERRORS) as exc:
            _fail(exc, " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand))))


@click.group(cls=_Cli)
@click.version_option(package_name="edgeagent")
def main() -> None:
    """Train one PyTorch model across several edge devices as an asynchronous pipeline over MQTT."""


main.add_command(demo)
main.add_command(central)
main.add_command(worker)
main.add_command(broker)
main.add_command(credentials)
main.add_command(certs_command)
main.add_command(monitor)
main.add_command(profile)
main.add_command(predictor)
