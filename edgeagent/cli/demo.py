"""``edgeagent demo``: broker, central node and local worker processes in one command."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from edgeagent.broker import BrokerTls, EmbeddedBroker
from edgeagent.broker.certs import init_site
from edgeagent.broker.credentials import CredentialStore
from edgeagent.config import CentralConfig
from edgeagent.ops.logs import console
from edgeagent.roles.central import Central, ProgressHook, RunReport

log = logging.getLogger(__name__)


def worker_command(
    device_id: str,
    broker: str,
    cluster: str,
    slowdown: float,
    *,
    once: bool = True,
    extra: tuple[str, ...] = (),
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "edgeagent",
        "worker",
        "--id",
        device_id,
        "--broker",
        broker,
        "--cluster",
        cluster,
        "--slowdown",
        str(slowdown),
        "--threads",
        "1",
        *extra,
    ]
    return [*cmd, "--once"] if once else cmd


class LocalWorkers:
    """Worker processes ``worker-1 .. worker-n`` on this machine (the demo's devices).

    Workers log warnings only (``EDGEAGENT_WORKER_LOG_LEVEL`` overrides) so the progress bar stays readable.
    """

    def __init__(
        self,
        n: int,
        broker: str,
        cluster: str,
        slowdowns: list[float],
        *,
        kills: dict[str, int | str] | None = None,
        log_level: str | None = None,
        links: list[float] | None = None,
        logins: dict[str, str] | None = None,
        tls_dir: str | None = None,
    ) -> None:
        self.broker, self.cluster = broker, cluster
        self.logins = dict(logins or {})  # device id -> password file
        self.tls_dir = tls_dir  # CA and client certificates (mutual TLS)
        self.slowdowns = {f"worker-{i + 1}": slowdowns[i] for i in range(n)}
        self.kills = dict(kills or {})
        self.links = {f"worker-{i + 1}": (links or [0.0] * n)[i] for i in range(n)}
        unknown = set(self.kills) - set(self.slowdowns)
        if unknown:
            raise ValueError(f"--kill names {sorted(unknown)}; the workers are {sorted(self.slowdowns)}")
        level = log_level or os.environ.get("EDGEAGENT_WORKER_LOG_LEVEL", "WARNING")
        self.env = dict(os.environ, EDGEAGENT_LOG_LEVEL=level)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, device: str, *, inject: bool = True) -> subprocess.Popen[bytes]:
        extra: tuple[str, ...] = ()
        if inject and device in self.kills:
            at = self.kills[device]  # a batch (its backward) or "evalN" (the N-th evaluation batch)
            evaluation = isinstance(at, str)
            extra = ("--die-at-eval", str(at)[4:]) if evaluation else ("--die-at-backward", str(at))
        if self.links.get(device):
            extra = (*extra, "--link-mbps", str(self.links[device]))
        if device in self.logins:
            extra = (*extra, "--password-file", self.logins[device])
        if self.tls_dir:
            for key, path in tls_files(self.tls_dir, device).items():
                extra = (*extra, f"--{key.replace('_', '-')}", path)
        cmd = worker_command(device, self.broker, self.cluster, self.slowdowns[device], extra=extra)
        self.procs[device] = proc = subprocess.Popen(cmd, env=self.env)
        return proc

    def start_all(self) -> LocalWorkers:
        for device in self.slowdowns:
            self.start(device)
        return self

    def restart(self, device: str) -> subprocess.Popen[bytes]:
        """Start ``device`` again with the same id (as systemd would), without its fault injection."""
        old = self.procs.get(device)
        if old is not None and old.poll() is None:
            old.kill()
            old.wait()
        return self.start(device, inject=False)

    def stop(self, grace: float = 10.0) -> None:
        """Wait for the workers to leave after the run's stop command; terminate any that stay (e.g. a
        restarted worker that was not taken back into the run)."""
        deadline = time.monotonic() + grace
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.info("worker pid %d is still running; terminating it", p.pid)
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


@contextlib.contextmanager
def local_workers(
    n: int,
    broker: str,
    cluster: str,
    slowdowns: list[float],
    *,
    kills: dict[str, int | str] | None = None,
    links: list[float] | None = None,
    logins: dict[str, str] | None = None,
    tls_dir: str | None = None,
) -> Iterator[LocalWorkers]:
    workers = LocalWorkers(
        n, broker, cluster, slowdowns, kills=kills, links=links, logins=logins, tls_dir=tls_dir
    )
    try:
        yield workers.start_all()
    except BaseException:
        workers.stop(grace=0)  # the run failed (a mistake, Ctrl-C): its workers would wait for nothing
        raise
    workers.stop()


def _progress_hook(progress: Progress, task: Any) -> Any:
    state: dict[str, Any] = {"acc": None}

    def hook(values: dict[str, Any]) -> None:
        if "accuracy" in values:
            state["acc"] = values["accuracy"]
        if "batch" in values:
            acc = "" if state["acc"] is None else f" test acc {100 * state['acc']:.1f}%"
            progress.update(
                task,
                completed=values["batch"],
                total=values["total"],
                description=f"loss {values['loss']:.3f}{acc}",
            )

    return hook


def run_demo(
    config: CentralConfig,
    *,
    workers: int,
    slowdowns: list[float],
    broker: str | None,
    show_progress: bool = True,
    kills: dict[str, int | str] | None = None,
    on_progress: ProgressHook | None = None,
    links: list[float] | None = None,
    secure: bool = False,
    logins: dict[str, str] | None = None,
) -> RunReport:
    """Run a whole training job on this machine and return its report.

    ``secure``: the embedded broker requires a login per device, enforces the topic rights
    (`edgeagent credentials`) and serves mqtts:// with client certificates (`edgeagent certs`), all
    throw-away. ``logins`` (device id, and ``central``, to a
    password file) are for an external broker that already has those logins.
    """
    if slowdowns and len(slowdowns) != workers + 1:
        raise ValueError(f"--slowdowns needs {workers + 1} factors (central first), got {len(slowdowns)}")
    factors = slowdowns or [1.0] * (workers + 1)
    if links and len(links) not in (1, workers + 1):
        raise ValueError(f"--link-mbps needs 1 or {workers + 1} values (central first), got {len(links)}")
    rates = (links * (workers + 1) if len(links) == 1 else links) if links else [0.0] * (workers + 1)
    cluster = config.cluster if config.cluster != "default" else f"demo-{uuid.uuid4().hex[:6]}"
    with contextlib.ExitStack() as stack:
        if secure and broker:
            raise ValueError("--secure makes throw-away logins for the embedded broker; drop --broker")
        credentials = tls = tls_dir = None
        if secure:
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="edgeagent-demo-"))
            credentials = os.path.join(scratch, "credentials")
            devices = ["central", *(f"worker-{i + 1}" for i in range(workers))]
            logins = throwaway_logins(credentials, cluster, devices, scratch)
            tls_dir = os.path.join(scratch, "tls")
            site = init_site(tls_dir, ["127.0.0.1"], devices)
            tls = BrokerTls(
                str(site.broker.cert), str(site.broker.key), str(site.ca.cert), require_client_cert=True
            )
        embedded = None if broker else EmbeddedBroker(credentials=credentials, tls=tls).start()
        if embedded is not None:
            stack.callback(embedded.stop)
        url = broker or (embedded.url if embedded else "")
        config = config.model_copy(
            update={
                "broker": url,
                "cluster": cluster,
                "workers": workers,
                "slowdown": factors[0],
                "link_mbps": rates[0],
                # The demo's workers are not restarted after a --kill (no systemd here): recover at once
                # instead of waiting for them to come back, unless asked to wait.
                **({"restart_window": 0.0} if "restart_window" not in config.model_fields_set else {}),
                **({"password_file": logins["central"]} if logins and "central" in logins else {}),
                **(tls_files(tls_dir, "central") if tls_dir else {}),
            }
        )
        stack.enter_context(
            local_workers(
                workers,
                url,
                cluster,
                factors[1:],
                kills=kills,
                links=rates[1:],
                logins=logins,
                tls_dir=tls_dir,
            )
        )
        if show_progress and config.progress:
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            with Progress(*columns, console=console, transient=False) as progress:
                task = progress.add_task("starting", total=None)
                return Central(config, progress=_progress_hook(progress, task)).run()
        return Central(config, progress=on_progress).run()
    raise AssertionError("unreachable")  # for mypy: the with block returns


def tls_files(directory: str, device: str) -> dict[str, str]:
    """The CA and a device's client certificate in a site directory made by ``edgeagent certs``."""
    return {
        "ca_file": os.path.join(directory, "ca.pem"),
        "cert_file": os.path.join(directory, f"{device}.pem"),
        "key_file": os.path.join(directory, f"{device}.key"),
    }


def throwaway_logins(credentials: str, cluster: str, devices: list[str], secrets_dir: str) -> dict[str, str]:
    """Logins for ``devices`` (``central`` gets the central role) and their password files."""
    store = CredentialStore(credentials)
    logins = {}
    for device in devices:
        password = store.add(device, role="central" if device == "central" else "device", cluster=cluster)
        path = os.path.join(secrets_dir, f"{device}.password")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            f.write(password + "\n")
        logins[device] = path
    return logins
