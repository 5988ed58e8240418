"""The ``edgeagent`` command."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import yaml

from edgeagent.config import CentralConfig, DemoConfig, WorkerConfig, build, load, load_yaml, merge
from edgeagent.errors import ConfigError, EdgeAgentError, ProtocolError, TrainingError
from edgeagent.ops.logs import console, setup_logging

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("edgeagent")


def _floats(text: str | None) -> list[float]:
    if not text:
        return []
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers like 1,1,6; got {text!r}") from None


_ACCESS_KEYS = ("username", "password_file", "ca_file", "cert_file", "key_file")


def access_options(f: F) -> F:
    """How to log in to the broker (see `edgeagent credentials` and `edgeagent certs`)."""
    options = [
        click.option("--username", help="Broker login (default: the device id, with --password-file)."),
        click.option(
            "--password-file",
            help="File holding the broker password (relative names are also looked up in "
            "$CREDENTIALS_DIRECTORY for systemd's LoadCredential=).",
        ),
        click.option("--ca-file", help="CA of the broker's certificate (mqtts://)."),
        click.option("--cert-file", help="Client certificate (mutual TLS)."),
        click.option("--key-file", help="Key of --cert-file."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _access(broker: str, kw: dict[str, Any], default_user: str) -> tuple[Any, Any]:
    """(BrokerUrl, TlsOptions) for the tools (monitor, profile), from their flags."""
    from edgeagent.config import BrokerAccess
    from edgeagent.transport.access import resolve

    given = {k: kw[k] for k in _ACCESS_KEYS if kw.get(k)}
    access = build(BrokerAccess, {"broker": broker, **given}, source="<arguments>")
    return resolve(access, default_user)


def train_options(f: F) -> F:
    """Flags shared by ``demo`` and ``central``; each one overrides the YAML file's value."""
    options = [
        click.option(
            "--config", "config_file", type=click.Path(dir_okay=False), help="YAML file (see configs/)."
        ),
        click.option("--epochs", type=int, help="Epochs to train."),
        click.option("--model", help="mlp | cnn | mobilenetv2 | pkg.module:function."),
        click.option(
            "--model-option",
            "model_option",
            multiple=True,
            help="KEY=VALUE for the model (YAML value), e.g. width_mult=0.25 or hidden=[256,128].",
        ),
        click.option("--dataset", help="digits | synthetic[:N:CxHxW:K] | FILE.npz"),
        click.option("--batch-size", type=int),
        click.option("--lr", "learning_rate", type=float, help="Learning rate."),
        click.option("--seed", type=int),
        click.option("--in-flight", type=int, help="Batches in flight (0: one per stage; 1: no pipelining)."),
        click.option("--aggregation/--no-aggregation", default=None, help="FTPipeHD weight aggregation."),
        click.option("--max-batches", type=int, help="Stop after this many batches."),
        click.option(
            "--init-weights",
            type=click.Path(exists=True, dir_okay=False),
            help="Pre-trained weights to continue from (a state_dict saved by --save-model).",
        ),
        click.option("--broker", help="mqtt://[user:pass@]host:port or mqtts://..."),
        click.option("--cluster", help="Cluster name: the topic root edgeagent/v1/<cluster>/."),
        click.option("--report", type=click.Path(dir_okay=False), help="Write a JSON run report here."),
        click.option("--save-model", type=click.Path(dir_okay=False), help="Save the trained model here."),
        click.option(
            "--partition",
            type=click.Choice(["uniform", "dynamic", "oracle"]),
            help="uniform: PipeDream's even split; dynamic: FTPipeHD (default); oracle: DP on true speeds.",
        ),
        click.option(
            "--repartition-first", type=int, help="Batches of epoch 0 before the first re-split (10)."
        ),
        click.option("--repartition-every", type=int, help="Batches between later re-splits (100)."),
        click.option(
            "--change-slowdown",
            "slowdown_changes",
            multiple=True,
            help="DEVICE@BATCH=F: from that batch on, DEVICE emulates an F-times slower device.",
        ),
        click.option(
            "--compression",
            type=click.Choice(["none", "2", "3", "4", "adaptive", "auto"]),
            help="AccEPT compression: k-bit activations, 8-bit gradients; adaptive; auto (from the links).",
        ),
        click.option(
            "--recovery",
            type=click.Choice(["ftpipehd", "respipe"]),
            help="ftpipehd: re-split over the survivors (default); respipe: the next worker takes over.",
        ),
        click.option("--chain-every", type=int, help="Batches between chain replications (50; 0: off)."),
        click.option("--global-every", type=int, help="Batches between global replications (100; 0: off)."),
        click.option("--replicas", type=int, help="Chain successors holding a replica (ResPipe's z; 1)."),
        click.option(
            "--timeout-multiplier",
            type=float,
            help="Deadlines (batch timer, evaluation, probe) = this x the predicted time of the work (4).",
        ),
        click.option(
            "--batch-timeout", type=float, help="Floor of the batch timer and evaluation deadline (10 s)."
        ),
        click.option("--probe-timeout", type=float, help="Floor of the probe window after a fault (1 s)."),
        click.option(
            "--restart-window",
            type=float,
            help="After a fault, seconds a missing device may take to restart with its id (recovery case 2; "
            "30, a Pi's service restart; 0: recover at once).",
        ),
        click.option(
            "--unmeasured-slowdown",
            type=float,
            help="Until a device has run a batch, take it as this many times slower than the central (50).",
        ),
        click.option(
            "--checkpoint",
            type=click.Path(dir_okay=False),
            help="Write a checkpoint here at every global replication.",
        ),
        click.option(
            "--home-assistant/--no-home-assistant",
            default=None,
            help="Publish Home Assistant MQTT discovery for every device (off by default).",
        ),
        click.option("--log-level", default="INFO", show_default=True),
    ]
    for option in reversed(options):
        f = option(f)
    return f


_TRAIN_KEYS = (
    "epochs",
    "model",
    "dataset",
    "batch_size",
    "learning_rate",
    "seed",
    "in_flight",
    "aggregation",
    "max_batches",
    "init_weights",
)
_CENTRAL_KEYS = (
    "home_assistant",
    "compression",
    "recovery",
    "chain_every",
    "global_every",
    "replicas",
    "timeout_multiplier",
    "batch_timeout",
    "probe_timeout",
    "restart_window",
    "unmeasured_slowdown",
    "checkpoint",
    "broker",
    "cluster",
    "report",
    "save_model",
    "partition",
    "repartition_first",
    "repartition_every",
    *_ACCESS_KEYS,
)


def _kills(items: tuple[str, ...]) -> dict[str, int | str]:
    """``ID@BATCH`` (SIGKILL at that batch's backward) or ``ID@evalN`` (at its N-th evaluation batch)."""
    kills: dict[str, int | str] = {}
    for item in items:
        device, sep, at = item.partition("@")
        evaluation = at.startswith("eval") and at[4:].isdigit() and int(at[4:]) >= 1
        if not sep or not (at.isdigit() or evaluation):
            raise click.BadParameter(
                f"expected ID@BATCH like worker-1@205 or ID@evalN like worker-2@eval1, got {item!r}",
                param_hint="--kill",
            )
        kills[device] = at if evaluation else int(at)
    return kills


def _model_options(items: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--model-option")
        options[key.strip()] = yaml.safe_load(value)
    return options


def _central_overrides(kw: dict[str, Any]) -> dict[str, Any]:
    train = {k: kw[k] for k in _TRAIN_KEYS if kw.get(k) is not None}
    if kw.get("model_option"):
        train["model_options"] = _model_options(kw["model_option"])
    central = {k: kw[k] for k in _CENTRAL_KEYS if kw.get(k) is not None}
    if kw.get("slowdown_changes"):
        central["slowdown_changes"] = list(kw["slowdown_changes"])
    return {**central, "train": train} if train else central


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


def _check_writable(flag: str, path: str) -> None:
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; give a file name")
    if not folder.is_dir():
        raise ConfigError(
            f"{flag} {path}: the directory {folder} does not exist; create it or pick another path"
        )
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ConfigError(f"{flag} {path}: not writable by this user; pick another path")


def _check_loadable(flag: str, path: str, what: str) -> None:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # whatever torch says, the file cannot be used: name it and the flag
        if isinstance(exc, pickle.UnpicklingError):  # torch's text here is a page about weights_only
            reason = "not written by torch.save, or it holds more than tensors and plain data"
        else:
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            reason = lines[0][:120]
        raise ConfigError(f"{flag} {path}: cannot read it ({reason}); give {what}") from exc
    if not isinstance(state, dict):
        raise ConfigError(f"{flag} {path} holds a {type(state).__name__}, not {what}")


def _preflight(config: CentralConfig) -> None:
    """The files a run reads and writes, checked before it starts: a typo in --report must not cost the
    whole run. (Loading --init-weights and --resume twice costs a second at start-up; the central node
    loads them again because it is also started without the CLI.)"""
    for flag, path in (
        ("--report", config.report),
        ("--save-model", config.save_model),
        ("--checkpoint", config.checkpoint),
    ):
        if path:
            _check_writable(flag, path)
    if config.train.init_weights:
        _check_loadable("--init-weights", config.train.init_weights, "a state dict saved with --save-model")
    if config.resume:
        _check_loadable("--resume", config.resume, "a checkpoint written with --checkpoint")


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


@main.command()
@train_options
@click.option("--workers", type=int, help="Local worker processes to start (default 2).")
@click.option("--slowdowns", help="Compute slowdown per device, central first, e.g. 1,1,6.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--secure",
    is_flag=True,
    help="Throw-away logins, topic rights and mutual TLS: the embedded broker as deployed on a LAN.",
)
@click.option(
    "--link-mbps",
    "link_mbps",
    help="Emulated uplink in Mbit/s: one value, or one per device (central first), e.g. 0.5 or 4,1,1.",
)
@click.option(
    "--kill",
    "kills",
    multiple=True,
    help="ID@BATCH: SIGKILL worker ID when BATCH starts its backward pass; ID@evalN: when it takes its "
    "N-th evaluation batch (fault injection).",
)
def demo(**kw: Any) -> None:
    """Broker + central node + local workers: the whole job on this machine."""
    from edgeagent.cli.demo import run_demo

    setup_logging(kw["log_level"], device="central")
    source = kw["config_file"] or "<arguments>"
    base = load_yaml(kw["config_file"]) if kw["config_file"] else {}
    section = build(DemoConfig, base.pop("demo", None) or {}, source=f"{source} (demo:)")
    config = build(CentralConfig, merge(base, _central_overrides({**kw, "broker": None})), source=source)
    _preflight(config)
    workers = kw["workers"] if kw["workers"] is not None else section.workers
    slowdowns = _floats(kw["slowdowns"]) or list(section.slowdowns)
    report = run_demo(
        config,
        workers=workers,
        slowdowns=slowdowns,
        broker=kw["broker"],
        show_progress=not kw["no_progress"],
        kills=_kills(kw["kills"]),
        links=_floats(kw["link_mbps"]),
        secure=kw["secure"],
    )
    _finish_report(report, config.report)


@main.command()
@train_options
@access_options
@click.option("--workers", type=int, help="Workers to wait for.")
@click.option("--id", "device_id", help="This node's device id (default central).")
@click.option("--slowdown", type=float, help="Emulate a device this many times slower (>= 1).")
@click.option("--threads", type=int, help="Torch threads.")
@click.option(
    "--resume",
    type=click.Path(exists=True, dir_okay=False),
    help="Continue the run of this checkpoint (written with --checkpoint) after a central failure.",
)
def central(**kw: Any) -> None:
    """The central node: holds the data, runs stage 0 and drives the run."""
    from edgeagent.roles.central import Central

    setup_logging(kw["log_level"], device=kw["device_id"] or "central")
    overrides = _central_overrides(kw)
    for key in ("workers", "device_id", "slowdown", "threads", "resume"):
        if kw.get(key) is not None:
            overrides[key] = kw[key]
    config = load(CentralConfig, kw["config_file"], overrides)
    _preflight(config)
    report = Central(config).run()
    _finish_report(report, config.report)


@main.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML file (see configs/).")
@click.option("--id", "device_id", help="Device id (default: the host name).")
@click.option("--broker", help="mqtt://[user:pass@]host:port or mqtts://...")
@access_options
@click.option("--cluster")
@click.option("--slowdown", type=float, help="Emulate a device this many times slower (>= 1).")
@click.option("--threads", type=int, help="Torch threads.")
@click.option("--heartbeat-interval", type=float)
@click.option("--memory-limit-mb", type=float, help="Memory the stage may use here; the DP respects it.")
@click.option("--link-mbps", type=float, help="Emulated uplink in Mbit/s (what this device sends).")
@click.option(
    "--die-at-backward", type=int, hidden=True, help="Fault injection: SIGKILL at this batch's backward."
)
@click.option(
    "--die-at-eval", type=int, hidden=True, help="Fault injection: SIGKILL at the N-th evaluation batch."
)
@click.option("--once", is_flag=True, default=None, help="Exit after one run.")
@click.option("--log-level", default=None)
def worker(**kw: Any) -> None:
    """A worker: runs whichever stage the central node assigns it."""
    from edgeagent.roles.worker import Worker

    overrides = {k: v for k, v in kw.items() if v is not None and k not in ("config_file", "log_level")}
    if "device_id" not in overrides:
        overrides["device_id"] = os.uname().nodename.split(".")[0]
    level = kw["log_level"] or os.environ.get("EDGEAGENT_LOG_LEVEL", "INFO")
    setup_logging(level, device=overrides["device_id"])
    config = load(WorkerConfig, kw["config_file"], overrides)
    w = Worker(config)
    signal.signal(signal.SIGTERM, lambda *_: w.stop())
    try:
        sys.exit(w.serve())
    except KeyboardInterrupt:
        w.stop()


_FILE = click.Path(exists=True, dir_okay=False)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), help="Port [default: 1883, or 8883 with --tls-cert].")
@click.option(
    "--credentials",
    type=click.Path(exists=True, file_okay=False),
    help="Directory made by `edgeagent credentials add`: logins and topic rights. Required beyond loopback.",
)
@click.option("--tls-cert", type=_FILE, help="Serve mqtts:// with this certificate.")
@click.option("--tls-key", type=_FILE, help="The key of --tls-cert.")
@click.option("--tls-ca", type=_FILE, help="Verify client certificates against this CA.")
@click.option("--require-client-cert", is_flag=True, help="Refuse TLS clients without a certificate.")
@click.option("--log-level", default="INFO")
def broker(
    host: str,
    port: int | None,
    credentials: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
    require_client_cert: bool,
    log_level: str,
) -> None:
    """The embedded MQTT 3.1.1 broker (amqtt)."""
    from amqtt.errors import BrokerError

    from edgeagent.broker import BrokerTls, serve_forever

    setup_logging(log_level, device="broker")
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if tls_cert is None and (tls_ca or require_client_cert):
        raise ConfigError("--tls-ca and --require-client-cert need --tls-cert and --tls-key")
    if require_client_cert and not tls_ca:
        raise ConfigError("--require-client-cert needs --tls-ca to verify the client certificates")
    tls = (
        BrokerTls(tls_cert, tls_key, tls_ca, require_client_cert)
        if tls_cert is not None and tls_key is not None
        else None
    )
    port = port or (8883 if tls else 1883)
    try:
        serve_forever(host, port, credentials=credentials, tls=tls)
    except BrokerError as exc:  # amqtt's wrapper of the listener's OSError (port taken, bad address)
        cause = exc.__cause__ or exc
        raise ConfigError(
            f"cannot listen on {host}:{port} ({cause}); is another broker running there? "
            "Stop it or pick another --port / --host"
        ) from exc


@main.command()
@click.option("--broker", default="mqtt://127.0.0.1:1883", show_default=True)
@click.option("--cluster", default=None, help="Show one cluster (default: all).")
@click.option("--refresh", default=0.5, show_default=True, type=float, help="Seconds between redraws.")
@click.option("--duration", default=None, type=float, help="Stop after this many seconds (default: Ctrl-C).")
@click.option(
    "--show-left",
    is_flag=True,
    help="Keep listing devices that left (shut down cleanly); by default they are hidden "
    "30 s after leaving, at once if they had left before the monitor started.",
)
@access_options
def monitor(
    broker: str, cluster: str | None, refresh: float, duration: float | None, show_left: bool, **kw: Any
) -> None:
    """A live dashboard of the cluster: devices, stages, throughput, heartbeats and events."""
    from edgeagent.ops.monitor import run_monitor

    setup_logging("WARNING")
    url, tls = _access(broker, kw, "monitor")
    run_monitor(broker=url, cluster=cluster, refresh=refresh, duration=duration, tls=tls, show_left=show_left)


@main.group()
def profile() -> None:
    """Device profiles (configs/devices/<id>.yaml), pushed from the central node as retained messages."""


def _profile_transport(broker: str, cluster: str, kw: dict[str, Any]) -> tuple[Any, Any]:
    from edgeagent.protocol.topics import Topics
    from edgeagent.transport.mqtt import MqttTransport

    url, tls = _access(broker, kw, "central")
    transport = MqttTransport(url, f"ea-profile-{os.getpid()}", tls=tls)
    if not transport.wait_connected(10):
        transport.close()
        raise EdgeAgentError(
            f"no broker at {url.redacted()} within 10 s; is it running, and is --broker right?"
        )
    return transport, Topics(cluster)


_profile_options = [
    click.option("--broker", default="mqtt://127.0.0.1:1883", show_default=True),
    click.option("--cluster", default="default", show_default=True),
    click.option(
        "--dir", "directory", default="configs/devices", show_default=True, type=click.Path(file_okay=False)
    ),
]


def profile_options(f: F) -> F:
    for option in reversed(_profile_options):
        f = option(f)
    return access_options(f)


@profile.command("push")
@profile_options
@click.argument("ids", nargs=-1)
def profile_push(broker: str, cluster: str, directory: str, ids: tuple[str, ...], **kw: Any) -> None:
    """Validate the profiles (all of DIR, or the IDS) and push them to their devices."""
    from edgeagent.ops import profiles as profiles_module

    if not Path(directory).is_dir():
        raise ConfigError(f"--dir {directory}: no such directory; give the directory of <id>.yaml profiles")
    found = profiles_module.load_profiles(directory, list(ids) or None)
    if not found:
        raise ConfigError(f"no profiles (<id>.yaml) in {directory}; nothing to push")
    transport, topics = _profile_transport(broker, cluster, kw)
    try:
        profiles_module.push(transport, topics, found)
    finally:
        transport.close()
    for p in found:
        console.print(f"pushed {p.id} (profile {p.digest()})")


@profile.command("show")
@profile_options
@click.argument("device_id")
def profile_show(broker: str, cluster: str, directory: str, device_id: str, **kw: Any) -> None:
    """Print the profile the broker holds for DEVICE_ID."""
    from edgeagent.ops import profiles as profiles_module

    transport, topics = _profile_transport(broker, cluster, kw)
    try:
        current = profiles_module.fetch(transport, topics, device_id)
    finally:
        transport.close()
    if current is None:
        console.print(f"no profile pushed for {device_id} on cluster {cluster}")
        sys.exit(1)
    console.print(f"# profile {current.digest()}\n{profiles_module.dump(current)}", highlight=False)


@profile.command("diff")
@profile_options
@click.argument("device_id")
def profile_diff(broker: str, cluster: str, directory: str, device_id: str, **kw: Any) -> None:
    """Compare DIR/DEVICE_ID.yaml with the profile the broker holds."""
    import difflib

    from edgeagent.ops import profiles as profiles_module

    local = profiles_module.load_profile(Path(directory) / f"{device_id}.yaml")
    transport, topics = _profile_transport(broker, cluster, kw)
    try:
        current = profiles_module.fetch(transport, topics, device_id)
    finally:
        transport.close()
    pushed = profiles_module.dump(current).splitlines() if current else []
    lines = list(
        difflib.unified_diff(pushed, profiles_module.dump(local).splitlines(), "pushed", "local", lineterm="")
    )
    console.print("\n".join(lines) if lines else "no difference", highlight=False)


def _register_certs() -> None:
    from edgeagent.broker.certs import certs_command

    main.add_command(certs_command)


_register_certs()


@main.group()
def credentials() -> None:
    """Broker logins and topic rights (per-device passwords; ACLs for amqtt and Mosquitto)."""


_credentials_dir = click.option(
    "--dir",
    "directory",
    default="/etc/edgeagent/broker",
    show_default=True,
    type=click.Path(file_okay=False),
    help="The credentials directory (give it to `edgeagent broker --credentials`).",
)


@credentials.command("add")
@_credentials_dir
@click.argument("names", nargs=-1)
@click.option(
    "--role",
    type=click.Choice(["device", "central", "observer"]),
    default="device",
    show_default=True,
    help="device: own topics and stage outputs; central: the whole cluster; observer: read only.",
)
@click.option("--cluster", default="default", show_default=True, help="The cluster (* for all).")
@click.option(
    "--profiles",
    type=click.Path(exists=True, file_okay=False),
    help="Also add a device login for every profile in this directory (e.g. configs/devices).",
)
@click.option(
    "--password-out",
    type=click.Path(file_okay=False),
    help="Write each new password to DIR/<name>.password (mode 0600) instead of printing it.",
)
@click.option(
    "--home-assistant-prefix",
    default="homeassistant",
    show_default=True,
    help="Home Assistant's MQTT discovery prefix: a central login may publish its cluster's discovery "
    "configs under it (`edgeagent central --home-assistant`), an observer (Home Assistant) reads it.",
)
def credentials_add(
    directory: str,
    names: tuple[str, ...],
    role: str,
    cluster: str,
    profiles: str | None,
    password_out: str | None,
    home_assistant_prefix: str,
) -> None:
    """Add logins NAMES (or re-key existing ones) with random passwords."""
    from edgeagent.broker.credentials import CredentialStore
    from edgeagent.ops.profiles import load_profiles

    store = CredentialStore(directory)
    wanted = [(n, role) for n in names]
    if profiles:
        known = store.users()
        wanted += [(p.id, "device") for p in load_profiles(profiles, None) if p.id not in known]
    if not wanted:
        raise ConfigError("nothing to add: give NAMES or --profiles DIR")
    for name, name_role in wanted:
        password = store.add(
            name, role=name_role, cluster=cluster, home_assistant_prefix=home_assistant_prefix
        )
        if password_out:
            out = Path(password_out)
            out.mkdir(parents=True, exist_ok=True)
            target = out / f"{name}.password"
            target.touch(mode=0o600, exist_ok=True)
            target.chmod(0o600)
            target.write_text(password + "\n", encoding="utf-8")
            console.print(f"added {name} ({name_role}, cluster {cluster}); password in {target}")
        else:
            console.print(f"added {name} ({name_role}, cluster {cluster}); password: {password}")
    console.print(
        f"the embedded broker ({directory}) picks this up at the next login; Mosquitto needs "
        "`kill -HUP` (password_file mosquitto.passwd, acl_file mosquitto.acl)",
        highlight=False,
    )


@credentials.command("remove")
@_credentials_dir
@click.argument("names", nargs=-1, required=True)
def credentials_remove(directory: str, names: tuple[str, ...]) -> None:
    """Remove logins NAMES (connected clients keep their session until they reconnect)."""
    from edgeagent.broker.credentials import CredentialStore

    store = CredentialStore(directory)
    for name in names:
        store.remove(name)
        console.print(f"removed {name}")


@credentials.command("list")
@_credentials_dir
def credentials_list(directory: str) -> None:
    """List the logins, their roles and clusters (never passwords)."""
    from edgeagent.broker.credentials import CredentialStore
    from edgeagent.ops.homeassistant import DEFAULT_PREFIX

    users = CredentialStore(directory).users()
    if not users:
        console.print(f"no logins in {directory}; add some with `edgeagent credentials add`")
        return
    for name, user in sorted(users.items()):
        grant = user.grant
        prefix = grant.home_assistant_prefix
        extra = f"  home assistant {prefix}" if prefix != DEFAULT_PREFIX and grant.role != "device" else ""
        console.print(f"{name:24} {grant.role:9} cluster {grant.cluster}{extra}", highlight=False)


def _finish_report(report: Any, path: str | None) -> None:
    data = report.to_dict()
    acc = ", ".join(f"{100 * a:.1f}" for a in data["test_accuracy_per_epoch"])
    console.print(
        f"[bold green]done[/]: final test accuracy {100 * data['final_accuracy']:.2f}% "
        f"after {data['batches']} batches / {data['epochs']} epochs; "
        f"{data['samples_per_second']:.1f} samples/s; wall {data['wall_seconds']:.1f} s\n"
        f"  accuracy per epoch (%): {acc}\n  partition points: {data['partitions'][-1]['points']}"
    )
    for rec in data["recoveries"]:
        if rec.get("case") == "central":
            console.print(f"  resumed from the checkpoint of batch {rec['resumed_from']}")
            continue
        console.print(
            f"  recovery (case {rec['case']}) at batch {rec['batch']}: lost {rec['lost'] or 'none'}, "
            f"restarted {rec['restarted'] or 'none'}; {rec['resumed_at'] - rec['detected_at']:.2f} s after "
            f"detection; rolled back to batch {rec['rolled_back_to']} ({rec['batches_replayed']} replayed)"
        )
    if path:
        Path(path).write_text(json.dumps(data, indent=2))
        console.print(f"report written to {path}")
        try:
            from edgeagent.ops.report import write_plots

            plots = write_plots(data, path)
        except Exception as exc:  # a plotting problem must never cost the user the JSON report
            log.warning("report plots not written: %s", exc)
        else:
            console.print("plots: " + ", ".join(str(p) for p in plots))
