"""The ``edgeagent`` command: the group, its error boundary, and the commands of each module.

* :mod:`.train`: ``demo``, ``central``, ``worker``;
* :mod:`.broker`: ``broker``, ``credentials``, ``certs``;
* :mod:`.ops`: ``monitor``, ``profile``;
* :mod:`.predictor`: ``predictor``;
* :mod:`.deploy`: ``install-service``, ``bundle``.

A command's module is imported when that command runs: ``broker``, ``credentials``, ``certs``,
``monitor``, ``profile``, ``install-service`` and ``bundle`` never import torch (seconds on a Pi), nor
does a typo in a command name.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import sys
from typing import Any, NoReturn

import click

from edgeagent.errors import ConfigError, EdgeAgentError, ProtocolError, StorageError, TrainingError

log = logging.getLogger("edgeagent")


# Note: a user's mistake ends in one line, never a traceback.
#     Every command runs under ``_Cli.invoke``: an EdgeAgentError (whose message says what to change),
#     and the ValueError, KeyError and OSError that bad input raises from libraries (a model option of
#     the wrong type, a file that is not there), end as ``error: ...`` on stderr with exit status 2 (1
#     for a run that failed: TrainingError, ProtocolError, StorageError). Anything else is a bug and keeps its
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
    sys.exit(1 if isinstance(exc, TrainingError | ProtocolError | StorageError) else 2)


# An optional dependency -> the extra that installs it (pyproject.toml): a worker's install has none of them.
EXTRAS: dict[str, str] = {
    "amqtt": "broker",
    "pwdlib": "broker",
    "argon2": "broker",
    "cryptography": "central",
    "matplotlib": "central",
}


def _missing_extra(exc: ModuleNotFoundError) -> str | None:
    """What to install when ``exc`` is an optional dependency this install left out, else None."""
    extra = EXTRAS.get((exc.name or "").partition(".")[0])
    if extra is None:
        return None
    return (
        f"this command needs {exc.name}, which this install of edgeagent leaves out (a worker needs none "
        f"of it): pip install 'edgeagent[{extra}]' (or 'edgeagent[all]')"
    )


# command name -> (module, attribute): imported on first use (see the module doc).
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("edgeagent.cli.train", "demo"),
    "central": ("edgeagent.cli.train", "central"),
    "worker": ("edgeagent.cli.train", "worker"),
    "broker": ("edgeagent.cli.broker", "broker"),
    "credentials": ("edgeagent.cli.broker", "credentials"),
    "certs": ("edgeagent.cli.broker", "certs_command"),
    "monitor": ("edgeagent.cli.ops", "monitor"),
    "profile": ("edgeagent.cli.ops", "profile"),
    "predictor": ("edgeagent.cli.predictor", "predictor"),
    "install-service": ("edgeagent.cli.deploy", "install_service"),
    "bundle": ("edgeagent.cli.deploy", "bundle"),
    "report": ("edgeagent.cli.report", "report"),
}


class _Cli(click.Group):
    """The ``edgeagent`` group: runs every subcommand under the one error boundary (see the Note), and
    imports a subcommand's module only when it is asked for (:data:`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        command = getattr(importlib.import_module(where[0]), where[1])
        assert isinstance(command, click.Command), where
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (EdgeAgentError, *_INPUT_ERRORS) as exc:
            _fail(exc, " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand))))
        except ModuleNotFoundError as exc:
            hint = _missing_extra(exc)
            if hint is None:
                raise
            _fail(ConfigError(hint))


@click.group(cls=_Cli)
@click.version_option(package_name="edgeagent")
def main() -> None:
    """Train one PyTorch model across several edge devices as an asynchronous pipeline over MQTT."""


def entry() -> NoReturn:
    """The ``edgeagent`` program (``python -m edgeagent``): :func:`main`, then the exit without the
    interpreter's teardown of torch's modules (0.4-0.6 s on this machine, seconds on a Pi, at every
    exit and so in every restart). The command has finished by then: its threads stopped, its files
    closed; logs and the standard streams are flushed here. An exception other than SystemExit (a bug)
    keeps the interpreter's handling, traceback and all."""
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # what sys.exit("text") prints
        code = 1
    logging.shutdown()
    trace = sys.modules.get("edgeagent.runtime.hoptrace")  # loaded by a role: flush its hop trace
    if trace is not None:
        trace.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code or 0)
