"""``edgeagent demo``: broker, central node and local worker processes in one command."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from edgeagent.broker import BrokerTls
from edgeagent.broker.certs import init_site
from edgeagent.broker.credentials import CredentialStore
from edgeagent.broker.process import BrokerProcess
from edgeagent.config import CentralConfig, model_path
from edgeagent.errors import ConfigError
from edgeagent.modes import mode
from edgeagent.ops.cgroups import (
    CFS_PERIOD_US,
    CPU_ROOT,
    MIN_QUOTA_US,
    cgroup_problem,
    joined,
    make_cgroup,
    remove_cgroups,
)
from edgeagent.ops.logs import console
from edgeagent.roles.central import Central, ProgressHook, RunReport
from edgeagent.roles.central.node import load_run

KEPT_ENV = ("EDGEAGENT_AUDIT_DIR", "EDGEAGENT_WORKER_LOG_LEVEL", "EDGEAGENT_HOP_TRACE")

log = logging.getLogger(__name__)


def worker_command(
    device_id: str,
    broker: str,
    cluster: str,
    slowdown: float,
    *,
    once: bool = True,
    threads: int = 1,
    extra: tuple[str, ...] = (),
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "edgeagent",
        "worker",
        "--device-id",
        device_id,
        "--broker",
        broker,
        "--cluster",
        cluster,
        "--slowdown",
        str(slowdown),
        "--threads",
        str(threads),
        *extra,
    ]
    return [*cmd, "--once"] if once else cmd


CPU_HINT = f"--worker-cpu needs root and a cgroup cpu controller (v1 or v2) at {CPU_ROOT}"
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}")


def _per_worker(text: str | None, workers: int, flag: str, example: str) -> list[str]:
    """``text`` split at commas: one value for every worker, or one per worker (empty: [])."""
    if text is None or not text.strip():
        return []
    items = [v.strip() for v in text.split(",")]
    if len(items) not in (1, workers):
        raise ConfigError(
            f"{flag} {text!r}: needs 1 value or {workers} (one per worker, central not included), "
            f"got {len(items)}; e.g. {example}"
        )
    return items * workers if len(items) == 1 else items


def _numbers(
    text: str | None,
    items: list[str],
    convert: Callable[[str], float],
    *,
    flag: str,
    kind: str,
    example: str,
    empty: str = "0",
) -> list[float]:
    """Every item converted (an empty item: ``convert(empty)``); a clear error naming the flag for one
    that is not ``kind``."""
    values = []
    for item in items:
        try:
            values.append(convert(item or empty))
        except ValueError:
            raise ConfigError(f"{flag} {text!r}: {item!r} is not {kind}; give {example}") from None
    return values


def parse_worker_cpu(text: str | None, workers: int) -> list[float]:
    """``--worker-cpu``: percent of one core per worker (``100,50,25``; 0 or empty: no limit). Returns
    one percentage per worker (0.0: no limit), or [] when no worker is limited."""
    items = _per_worker(text, workers, "--worker-cpu", "100,50,25")
    example = "percent of one core per worker, e.g. 100,50,25 (0 or empty: no limit)"
    values = _numbers(text, items, float, flag="--worker-cpu", kind="a number", example=example)
    return check_worker_cpu(values, workers)


def check_worker_cpu(percents: list[float] | None, workers: int) -> list[float]:
    """Validate the CPU limits (percent of one core per worker, 0: none); [] when none is set."""
    if not percents or not any(percents):
        return []
    if len(percents) != workers:
        raise ConfigError(f"--worker-cpu needs {workers} values (one per worker), got {len(percents)}")
    for device, pct in zip(device_ids(workers), percents, strict=True):
        least = 100 * MIN_QUOTA_US / CFS_PERIOD_US
        if not math.isfinite(pct) or pct < 0 or 0 < pct < least:
            raise ConfigError(
                f"--worker-cpu: {device} at {pct:g}%: give 0 (no limit) or at least {least:g} (percent of "
                f"one core; the kernel's smallest quota is {MIN_QUOTA_US // 1000} ms per "
                f"{CFS_PERIOD_US // 1000} ms period)"
            )
        if pct > 100 * (os.cpu_count() or 1):
            log.warning(
                "--worker-cpu: %s at %g%% is more than this machine's %d cores: no limit in effect",
                device,
                pct,
                os.cpu_count() or 1,
            )
    return [float(p) for p in percents]


def parse_worker_threads(text: str | None, workers: int) -> list[int]:
    """``--worker-threads``: torch threads per worker (``1,2``); default 1 each."""
    items = _per_worker(text, workers, "--worker-threads", "1,2") or ["1"] * workers
    example = "torch threads per worker, e.g. 1,2"
    values = _numbers(
        text, items, int, flag="--worker-threads", kind="a whole number", example=example, empty="1"
    )
    return check_worker_threads([int(v) for v in values], workers)


def check_worker_threads(threads: list[int] | None, workers: int) -> list[int]:
    """Validate torch threads per worker (None or []: 1 each)."""
    if not threads:
        return [1] * workers
    if len(threads) != workers:
        raise ConfigError(f"--worker-threads needs {workers} values (one per worker), got {len(threads)}")
    for device, n in zip(device_ids(workers), threads, strict=True):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 256:
            raise ConfigError(f"--worker-threads: {device} with {n!r} threads; give a whole number 1-256")
    return list(threads)


def device_ids(workers: int) -> list[str]:
    return [f"worker-{i + 1}" for i in range(workers)]


def cgroup_root(cluster: str, root: Path = CPU_ROOT) -> Path:
    """Where the demo's workers of ``cluster`` get their cpu groups (one per device below it)."""
    if not _SAFE_NAME.fullmatch(cluster) or cluster.startswith("."):
        raise ConfigError(
            f"--worker-cpu: cluster {cluster!r} cannot name a cgroup; use letters, digits and '._+-'"
        )
    return root / f"edgeagent-demo-{cluster}"


def check_cgroups(root: Path = CPU_ROOT) -> None:
    """Raise :class:`ConfigError` naming what is missing when CPU limits cannot be set here."""
    problem = cgroup_problem(root)
    if problem is not None:
        hint = CPU_HINT if root == CPU_ROOT else CPU_HINT.replace(str(CPU_ROOT), str(root))
        raise ConfigError(f"{hint}; missing here: {problem}")


class WorkerProcess(Protocol):
    """What :class:`LocalWorkers` uses of a worker's process (``subprocess.Popen``'s methods)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


def popen(cmd: list[str], env: dict[str, str]) -> WorkerProcess:
    """A worker's process: ``cmd`` started with ``env``."""
    return subprocess.Popen(cmd, env=env)


class LocalWorkers:
    """Worker processes ``worker-1 .. worker-n`` on this machine (the demo's devices).

    Workers log warnings only (``EDGEAGENT_WORKER_LOG_LEVEL`` overrides) so the progress bar stays readable.

    ``cpu``: percent of one core per worker (0: no limit). A limited worker runs in its own cgroup v1 cpu
    group ``<cpu_root>/edgeagent-demo-<cluster>/<device>`` with a CFS quota, joined before the worker
    execs; a restart joins the same group. :meth:`stop` removes the groups. ``threads``: torch threads
    per worker (default 1 each). ``spawn`` starts a process (the tests fork theirs from a process that
    imported torch once: tests/zygote.py).
    """

    spawn: Callable[[list[str], dict[str, str]], WorkerProcess] = staticmethod(popen)

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
        cpu: list[float] | None = None,
        threads: list[int] | None = None,
        cpu_root: Path = CPU_ROOT,
        datasets: list[str] | None = None,
        downs: list[float] | None = None,
        allowed_models: list[str] | None = None,
        extra: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.broker, self.cluster = broker, cluster
        # User models the workers may build (--allow-model): the one the demo trains (see allowed_for).
        self.allowed_models = list(allowed_models or [])
        self.extra = dict(extra or {})  # device id -> more worker flags (tests: --send-nan, ...)
        # Split-federated training: each worker's own data set (--dataset), in worker order.
        self.datasets = {f"worker-{i + 1}": path for i, path in enumerate(datasets or [])}
        self.downs = {f"worker-{i + 1}": mbps for i, mbps in enumerate(downs or [])}  # emulated downlinks
        self.logins = dict(logins or {})  # device id -> password file
        self.tls_dir = tls_dir  # CA and client certificates (mutual TLS)
        self.slowdowns = {f"worker-{i + 1}": slowdowns[i] for i in range(n)}
        self.kills = dict(kills or {})
        self.links = {f"worker-{i + 1}": (links or [0.0] * n)[i] for i in range(n)}
        unknown = set(self.kills) - set(self.slowdowns)
        if unknown:
            raise ValueError(f"--kill names {sorted(unknown)}; the workers are {sorted(self.slowdowns)}")
        percents = check_worker_cpu(cpu, n)
        self.cpu = dict(zip(self.slowdowns, percents or [0.0] * n, strict=True))
        self.threads = dict(zip(self.slowdowns, check_worker_threads(threads, n), strict=True))
        self.cgroups: Path | None = None  # the run's group of groups, when a worker is limited
        if percents:
            check_cgroups(cpu_root)
            self.cgroups = cgroup_root(cluster, cpu_root)
        level = log_level or os.environ.get("EDGEAGENT_WORKER_LOG_LEVEL", "WARNING")
        # The workers get every setting as a flag: the demo's own EDGEAGENT_<KEY> variables (its central
        # node's options) are not theirs (EDGEAGENT_DATASET names the central node's data set).
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEAGENT_") or k in KEPT_ENV}
        self.env = dict(env, EDGEAGENT_LOG_LEVEL=level)
        self.procs: dict[str, WorkerProcess] = {}

    def cgroup(self, device: str) -> Path | None:
        """``device``'s cpu group (None: it runs without a limit)."""
        return self.cgroups / device if self.cgroups is not None and self.cpu[device] else None

    def start(self, device: str, *, inject: bool = True) -> WorkerProcess:
        extra: tuple[str, ...] = ()
        if inject and device in self.kills:
            at = self.kills[device]  # a batch (its backward) or "evalN" (the N-th evaluation batch)
            evaluation = isinstance(at, str)
            extra = ("--die-at-eval", str(at)[4:]) if evaluation else ("--die-at-backward", str(at))
        if self.links.get(device):
            extra = (*extra, "--link-mbps", str(self.links[device]))
        if self.datasets.get(device):
            extra = (*extra, "--dataset", self.datasets[device])
        if self.downs.get(device):
            extra = (*extra, "--down-mbps", str(self.downs[device]))
        if device in self.logins:
            extra = (*extra, "--password-file", self.logins[device])
        for model in self.allowed_models:
            extra = (*extra, "--allow-model", model)
        if self.tls_dir:
            for key, path in tls_files(self.tls_dir, device).items():
                extra = (*extra, f"--{key.replace('_', '-')}", path)
        extra = (*extra, *self.extra.get(device, ()))
        cmd = worker_command(
            device,
            self.broker,
            self.cluster,
            self.slowdowns[device],
            threads=self.threads[device],
            extra=extra,
        )
        group = self.cgroup(device)
        if group is not None:  # the same group on a restart: made again if it is gone
            cmd = joined(cmd, make_cgroup(group, self.cpu[device] / 100))
        self.procs[device] = proc = self.spawn(cmd, self.env)
        return proc

    def start_all(self) -> LocalWorkers:
        for device in self.slowdowns:
            self.start(device)
        return self

    def restart(self, device: str) -> WorkerProcess:
        """Start ``device`` again with the same id (as systemd would), without its fault injection."""
        old = self.procs.get(device)
        if old is not None and old.poll() is None:
            old.kill()
            old.wait()
        return self.start(device, inject=False)

    def stop(self, grace: float = 10.0) -> None:
        """Wait for the workers to leave after the run's stop command; terminate any that stay (e.g. a
        restarted worker that was not taken back into the run). Then remove the cpu groups."""
        try:
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
        finally:
            self.remove_cgroups()

    def remove_cgroups(self) -> None:
        """Remove the workers' cpu groups (killing what still runs in them: only the demo starts
        processes there)."""
        if self.cgroups is None:
            return
        killed = remove_cgroups(self.cgroups)
        if killed:
            log.warning("killed %d process(es) left in %s", len(killed), self.cgroups)
        if self.cgroups.exists():
            log.warning("could not remove the cpu groups at %s", self.cgroups)


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
    cpu: list[float] | None = None,
    threads: list[int] | None = None,
    datasets: list[str] | None = None,
    allowed_models: list[str] | None = None,
) -> Iterator[LocalWorkers]:
    workers = LocalWorkers(
        n,
        broker,
        cluster,
        slowdowns,
        kills=kills,
        links=links,
        logins=logins,
        tls_dir=tls_dir,
        cpu=cpu,
        threads=threads,
        datasets=datasets,
        allowed_models=allowed_models,
    )
    try:
        yield workers.start_all()
    except BaseException:
        # The run failed (a mistake, Ctrl-C): its workers would wait for nothing. stop() removes the
        # cpu groups in any case (its finally), also when start_all itself failed.
        workers.stop(grace=0)
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
                description=values.get("description") or f"loss {values['loss']:.3f}{acc}",
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
    worker_cpu: list[float] | None = None,
    worker_threads: list[int] | None = None,
) -> RunReport:
    """Run a whole training job on this machine and return its report.

    ``secure``: the embedded broker requires a login per device, enforces the topic rights
    (`edgeagent credentials`) and serves mqtts:// with client certificates (`edgeagent certs`), all
    throw-away. ``logins`` (device id, and ``central``, to a
    password file) are for an external broker that already has those logins.

    ``worker_cpu``: percent of one core per worker (0: no limit; central not included), a real CPU
    limit (a cgroup v1 CFS quota; root only), unlike ``slowdowns``, which sleep and so scale every layer
    alike. ``worker_threads``: torch threads per worker (default 1 each).
    """
    # Checked before anything starts: a limit that cannot be set must not cost a broker start-up.
    cpu = check_worker_cpu(worker_cpu, workers)
    threads = check_worker_threads(worker_threads, workers)
    if cpu:
        check_cgroups()
    if slowdowns and len(slowdowns) != workers + 1:
        raise ValueError(f"--slowdowns needs {workers + 1} factors (central first), got {len(slowdowns)}")
    factors = slowdowns or [1.0] * (workers + 1)
    if links and len(links) not in (1, workers + 1):
        raise ValueError(f"--link-mbps needs 1 or {workers + 1} values (central first), got {len(links)}")
    rates = (links * (workers + 1) if len(links) == 1 else links) if links else [0.0] * (workers + 1)
    if not config.resume:  # the data set, the model, its options and the workers fit (a resumed run: its own)
        load_run(config.model_copy(update={"workers": workers}), mode, quiet=True)
    cluster = config.cluster if config.cluster != "default" else f"demo-{uuid.uuid4().hex[:6]}"
    if cpu:
        cgroup_root(cluster)  # the cluster must name a group
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
        # The broker in its own process: as a thread here it would share the GIL with stage 0.
        embedded = None if broker else BrokerProcess(credentials=credentials, tls=tls).start()
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
        shards = None
        if config.mode == "split-federated":  # each worker gets its own part of the training set
            from edgeagent.modes.splitfed import write_demo_shards

            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="edgeagent-shards-"))
            shards = write_demo_shards(config, workers, folder)
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
                cpu=cpu,
                threads=threads,
                datasets=shards,
                allowed_models=allowed_for(config.train.model),
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
                return Central(config, progress=_progress_hook(progress, task), modes=mode).run()
        return Central(config, progress=on_progress, modes=mode).run()
    raise AssertionError("unreachable")  # for mypy: the with block returns


def allowed_for(model: str) -> list[str]:
    """What the demo's workers must allow to train ``model``: a user model (a dotted path) the demo was
    told to train; nothing for a built-in one (workers build those anyway)."""
    return [model] if model_path(model) is not None else []


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
