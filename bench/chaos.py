"""Chaos: a long run under seeded faults of every kind against the same run without faults (issue 49, 7).

    sudo .venv/bin/python bench/chaos.py                 # both arms, >= 20 min each (root: netns links)
    sudo .venv/bin/python bench/chaos.py --quick         # a smoke run: a few minutes, one fault per kind
    .venv/bin/python bench/chaos.py --faults-only --seed 7 --per-kind 3

**Real parts** (``bench/chaos_lab.py``): the embedded broker as its own process over TLS with per-device
logins; the central node as the shipped unit's exact ``ExecStart`` (``systemd/edgeagent-central.service``,
``configs/central.yaml`` with the bench's broker and workload) and its restart the same command again, as
``systemctl restart`` or ``Restart=on-failure`` after ``RestartSec`` would; three workers as the worker
unit's ``ExecStart`` (serving runs, not ``--once``), each in its own network namespace behind a veth pair
(root; without root they share loopback and the dropped link is skipped).

**The workload**: the default MLP (six layers) on digits, four devices (central + 3 workers), batch 32,
``--lr-schedule cosine`` from 0.05 to 0 (the end is a plateau: a stable final accuracy to compare),
every device emulated ``--slowdown`` times slower (the central node too: stages of equal speed) so that
the fault-free run lasts the time the issue asks for (>= 20 minutes), replication points every 10
(chain) and 20 (global) batches so that a restart replays little. The fault-free arm is the same seed
and configuration with no faults; both arms run in one invocation (``--faults-only``, ``--baseline-only``).

**Faults** (``bench/chaos_faults.py``, seeded by ``--seed``, the schedule printed up front):
``--per-kind`` of each of eight kinds, in a seeded order at seeded batches spread over the run, each
after the previous one was survived: worker SIGKILL (started again with its id after a seeded delay; past
the 30 s restart window it is left out and joins later), worker SIGSTOP for seeded seconds (then SIGCONT),
central SIGTERM (then the unit's command again: ``systemctl restart``), central SIGKILL (the unit's
command again after its ``RestartSec``), a broker restart (stopped, started again on its port after
seeded seconds), a dropped link (the worker's veth down for seeded seconds), a device sending NaN (a
hidden worker setting, ``nan_on_usr1: gradient``: SIGUSR1 poisons its next gradient), a forged announce
(a device login announcing a ghost and another device, on its own topic and on theirs).

**Survived** (``Chaos.run``): the run commits the first batch it had not started at the fault, within a
window derived from the run's settings and measured pace; ``back`` is how long that took (recovery,
restart and replay included). Every wait is on what the cluster says (``run/events``, statuses) or does
(the batches stage 0 commits), never a fixed sleep; the seeded gap before a fault is the only sleep.

**Updates lost or applied twice**: every process appends the stage copies it builds and the batch ids whose
updates it applies to an audit log (``EDGEAGENT_AUDIT_DIR``, ``edgeagent/pipeline/audit.py``); after the
run the bench rebuilds each layer's lineage across devices and processes (a build at version V restores
the state of V, a rollback undoes the batches after it) and counts the batches missing from each layer's
final lineage (lost) and those in it more than once (applied twice).

**Output**: the schedule, a line per fault (time, kind, target, survived, seconds back, what the cluster
did), counts per kind, the final accuracy of both arms and their difference, lost / applied-twice counts,
and the acceptance (last line): every fault survived, the run finished, accuracy within 1 point of the
fault-free run, nothing lost or applied twice. Logs, reports and audit files stay in ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos_faults import Chaos, Fault, Forger, Kind, Outcome, forged_joins, make_schedule
from bench.chaos_lab import (
    CENTRAL_UNIT,
    Broker,
    Network,
    Service,
    Site,
    Workload,
    central_service,
    say,
    shipped_central,
    worker_service,
)
from bench.chaos_watch import Observer, Progress
from edgeagent.data import batches_per_epoch, load_dataset
from edgeagent.models import ModelSpec, build_model
from edgeagent.pipeline.audit import Verdict, check, read_dir

BATCH = 32  # configs/central.yaml's batch size


@dataclass
class Arm:
    """One arm's run: its report, the faults' outcomes, the audit's verdict."""

    name: str
    report: dict[str, Any] | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    skipped: list[Fault] = field(default_factory=list)
    verdict: Verdict | None = None
    unexpected: list[str] = field(default_factory=list)
    seconds: float = 0.0
    failed: str = ""

    @property
    def accuracy(self) -> float | None:
        return None if self.report is None else float(self.report["final_accuracy"])


def per_epoch(seed: int) -> int:
    data = load_dataset("digits", seed=seed)
    return batches_per_epoch(data.x_train.shape[0], BATCH)


def model_layers() -> int:
    return len(build_model(ModelSpec("mlp", (64,), 10, ()), seed=0))


# -- one arm -------------------------------------------------------------------------------------------


def run_arm(
    name: str,
    work: Workload,
    schedule: list[Fault],
    folder: Path,
    network: Network,
    *,
    total: int,
    limit: float,
) -> Arm:
    """Start the cluster, inject ``schedule`` (none: the fault-free arm), wait for the run to finish."""
    arm = Arm(name)
    started = time.monotonic()
    cluster = f"chaos{work.seed}-{name}-{secrets.token_hex(2)}"
    (folder / "logs").mkdir(parents=True)
    audit_dir = folder / "audit"
    audit_dir.mkdir()
    with contextlib.ExitStack() as stack:
        site = Site(folder / "site", cluster, work.worker_ids, network.host)
        broker = Broker(site, network.host, folder / "logs" / "broker.log")
        broker.start()
        stack.callback(broker.stop)
        progress = Progress(audit_dir)
        stack.callback(progress.close)
        observer = Observer(broker.url, cluster, site)
        stack.callback(observer.close)
        forger = Forger(broker.url, cluster, site) if schedule else None
        if forger is not None:
            stack.callback(forger.close)
        url = broker.url
        workers = {
            w: worker_service(
                folder, site, work, w, url=url, cluster=cluster, audit=audit_dir, netns=network.netns(w)
            )
            for w in work.worker_ids
        }
        central = central_service(folder, site, work, url=url, cluster=cluster, audit=audit_dir)
        for svc in workers.values():
            svc.start()
        stack.callback(_stop_all, list(workers.values()))
        say(f"[{name}] broker {url} (TLS, logins), cluster {cluster}; workers {', '.join(workers)}")
        say(f"[{name}] central: {' '.join(central.argv)}")
        launched = time.monotonic()
        central.start()
        stack.callback(central.stop)  # last in, first out: the central node stops before its workers
        first = progress.wait_for(lambda c: True, timeout=limit)
        if first is None:
            arm.failed = f"no batch committed in {limit:.0f} s (see {central.log})"
            return _finish(arm, started, central, workers)
        startup = first.t - launched
        say(f"[{name}] first batch committed {startup:.1f} s after the central node started")
        if schedule:
            assert forger is not None
            chaos = Chaos(work, network, broker, central, workers, observer, progress, forger, total, startup)
            stack.callback(chaos.close)
            _inject_all(arm, chaos, schedule, started, limit)
        left = limit - (time.monotonic() - started)
        if not central.finished.wait(max(1.0, left)):
            arm.failed = f"the run did not finish within {limit / 60:.0f} min"
        if schedule:
            joins = forged_joins(observer)
            forged = [o for o in arm.outcomes if o.fault.kind is Kind.FORGED_ANNOUNCE]
            for o in forged:
                o.problems += [f"a forged identity joined: {j}" for j in joins]
    report = folder / "central" / "state" / "report.json"
    if central.finished.is_set() and report.is_file():
        arm.report = json.loads(report.read_text())
    arm.verdict = check(read_dir(audit_dir), total=total, layers=model_layers())
    return _finish(arm, started, central, workers)


def _stop_all(services: list[Service]) -> None:
    for svc in services:
        svc.stop()


def _finish(arm: Arm, started: float, central: Service, workers: dict[str, Service]) -> Arm:
    arm.seconds = time.monotonic() - started
    arm.unexpected = [*central.unexpected, *(u for w in workers.values() for u in w.unexpected)]
    return arm


def _inject_all(arm: Arm, chaos: Chaos, schedule: list[Fault], started: float, limit: float) -> None:
    for fault in schedule:
        if time.monotonic() - started > limit:
            arm.skipped.append(fault)
            continue
        outcome = chaos.run(fault)
        if outcome is None:
            arm.skipped.append(fault)
            say(f"fault {fault.index}: the run ended before batch {fault.at}; not injected")
            continue
        arm.outcomes.append(outcome)
        say(fault_line(outcome, started))


# -- output ---------------------------------------------------------------------------------------------


def clock(seconds: float) -> str:
    return f"{int(seconds) // 60:02d}:{int(seconds) % 60:02d}"


def fault_line(o: Outcome, started: float) -> str:
    back = f"{o.back:6.1f} s" if o.back is not None else "  never"
    verdict = "survived" if o.survived else "NOT SURVIVED"
    line = (
        f"fault {o.fault.index:>2} at {clock(o.t - started)} after batch {o.batch:>4}: "
        f"{o.fault.kind.value:<16}{o.target:<9} {verdict}, back in {back} (window {o.window:.0f} s): "
        f"{o.summary()}"
    )
    return line + "".join(f"; PROBLEM: {p}" for p in o.problems)


def print_schedule(schedule: list[Fault], total: int) -> None:
    print(f"\nschedule: {len(schedule)} faults over batches {schedule[0].at}-{schedule[-1].at} of {total}")
    for f in schedule:
        print(f"  {f.index:>2}  after batch {f.at:>4} (+{f.lag:.2f} batches)  {f.describe()}")
    print(flush=True)


def print_kinds(outcomes: list[Outcome], kinds: list[Kind]) -> None:
    print(f"\n  {'kind':<18}{'injected':>9}{'survived':>9}{'back: median':>14}{'max':>8}")
    for kind in kinds:
        mine = [o for o in outcomes if o.fault.kind is kind]
        backs = [o.back for o in mine if o.back is not None]
        median = f"{statistics.median(backs):.1f} s" if backs else "-"
        most = f"{max(backs):.1f} s" if backs else "-"
        print(f"  {kind.value:<18}{len(mine):>9}{sum(o.survived for o in mine):>9}{median:>14}{most:>8}")


def audit_line(arm: Arm) -> str:
    v = arm.verdict
    if v is None:
        return f"{arm.name}: no audit"
    layers = len(v.lineages)
    text = (
        f"{arm.name}: {layers} layers x {v.total} batches: lost {v.lost_count}, applied twice {v.twice_count}"
        f", out of order {len(v.out_of_order)}, anomalies {len(v.anomalies)}"
    )
    return text + "".join(f"\n    {a}" for a in v.anomalies[:5])


def acceptance(baseline: Arm | None, faults: Arm | None, kinds: list[Kind], wanted: int) -> tuple[bool, str]:
    reasons = []
    if faults is not None:
        n = len(faults.outcomes)
        if n < wanted:
            reasons.append(f"{n} faults injected, {wanted} wanted")
        missing = [k.value for k in kinds if not any(o.fault.kind is k for o in faults.outcomes)]
        if missing:
            reasons.append(f"no fault of kind {', '.join(missing)}")
        lost = [o for o in faults.outcomes if not o.survived]
        if lost:
            reasons.append(f"{len(lost)} not survived (faults {', '.join(str(o.fault.index) for o in lost)})")
    if baseline is None or faults is None:
        reasons.append("both arms are needed to compare their accuracy")
    for arm in (a for a in (baseline, faults) if a is not None):
        if arm.failed or arm.report is None:
            reasons.append(f"{arm.name}: {arm.failed or 'no report'}")
        if arm.unexpected:
            reasons.append(f"{arm.name}: {len(arm.unexpected)} unexpected exits")
        v = arm.verdict
        if v is None or v.lost_count or v.twice_count or not v.ok:
            reasons.append(f"{arm.name}: the audit is not clean")
    if baseline is not None and faults is not None and None not in (baseline.accuracy, faults.accuracy):
        assert baseline.accuracy is not None and faults.accuracy is not None
        diff = 100 * (faults.accuracy - baseline.accuracy)
        if abs(diff) > 1.0:
            reasons.append(f"accuracy {diff:+.2f} points from the fault-free run")
    return not reasons, "; ".join(reasons)


def summary(baseline: Arm | None, faults: Arm | None, kinds: list[Kind], wanted: int) -> int:
    print("\n== summary ==")
    if faults is not None:
        survived = sum(o.survived for o in faults.outcomes)
        skipped = f", {len(faults.skipped)} not injected (the run ended first)" if faults.skipped else ""
        print(f"faults: {len(faults.outcomes)} injected, {survived} survived{skipped}")
        print_kinds(faults.outcomes, kinds)
    print()
    for arm in (a for a in (baseline, faults) if a is not None):
        acc = f"{100 * arm.accuracy:.2f} %" if arm.accuracy is not None else "-"
        report = arm.report or {}
        print(
            f"{arm.name:<11} final accuracy {acc}, {report.get('epochs', '?')} epochs, "
            f"wall {arm.seconds / 60:.1f} min" + (f", FAILED: {arm.failed}" if arm.failed else "")
        )
        for u in arm.unexpected:
            print(f"  unexpected: {u}")
    if baseline is not None and faults is not None and None not in (baseline.accuracy, faults.accuracy):
        assert baseline.accuracy is not None and faults.accuracy is not None
        print(f"difference  {100 * (faults.accuracy - baseline.accuracy):+.2f} points (faults - fault-free)")
    print("\nupdates (audit log: each layer's lineage of batch ids across devices and processes)")
    for arm in (a for a in (baseline, faults) if a is not None):
        print("  " + audit_line(arm))
    ok, why = acceptance(baseline, faults, kinds, wanted)
    print()
    print("ACCEPTANCE: " + ("PASS" if ok else f"FAIL: {why}"))
    return 0 if ok else 1


# -- main ---------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=49, help="the run's seed and the schedule's (49)")
    p.add_argument("--per-kind", type=int, help="faults of each kind (5; --quick 1)")
    p.add_argument("--epochs", type=int, help="epochs (30; --quick 3)")
    p.add_argument("--slowdown", type=float, help="every device's emulated slowdown (550; --quick 300)")
    p.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--faults-only", action="store_true", help="the arm with faults alone")
    which.add_argument("--baseline-only", action="store_true", help="the fault-free arm alone")
    p.add_argument("--kinds", help="a comma-separated subset of the kinds (all)")
    p.add_argument("--out", type=Path, help="where logs, reports and audit files go (a new temporary folder)")
    p.add_argument("--time-limit", type=float, default=75.0, help="minutes an arm may take (75)")
    args = p.parse_args()
    args.per_kind = args.per_kind or (1 if args.quick else 5)
    args.epochs = args.epochs or (3 if args.quick else 30)
    args.slowdown = args.slowdown or (300.0 if args.quick else 550.0)
    return args


def pick_kinds(text: str | None, *, isolated: bool) -> list[Kind]:
    kinds = list(Kind)
    if text:
        try:
            kinds = [Kind(k.strip()) for k in text.split(",")]
        except ValueError:
            raise SystemExit(f"--kinds {text}: choose from {', '.join(k.value for k in Kind)}") from None
    if not isolated and Kind.LINK_DOWN in kinds:
        say("not root: no network namespaces, so no dropped link (link-down skipped)")
        kinds.remove(Kind.LINK_DOWN)
    return kinds


@contextlib.contextmanager
def lab_network(workers: list[str], isolated: bool) -> Iterator[Network]:
    network = Network(workers, isolated=isolated)
    network.up()
    try:
        yield network
    finally:
        network.down()


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)  # unwinds: processes stopped, namespaces removed


def main() -> int:
    args = parse_args()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    isolated = os.geteuid() == 0
    kinds = pick_kinds(args.kinds, isolated=isolated)
    floors = shipped_central()
    work = Workload(
        seed=args.seed, epochs=args.epochs, workers=3, slowdown=args.slowdown,
        global_every=20, chain_every=10,
        batch_timeout=floors["batch_timeout"], restart_window=floors["restart_window"],
    )  # fmt: skip
    total = work.epochs * per_epoch(work.seed)
    first, last = min(30, total // 4), total - 2 * work.global_every - 4 * (work.workers + 1)
    schedule = make_schedule(
        args.seed, kinds, per_kind=args.per_kind, first=first, last=last, workers=work.worker_ids,
        restart_sec=CENTRAL_UNIT.restart_sec,
    )  # fmt: skip
    out = args.out or Path(tempfile.mkdtemp(prefix=f"chaos-{args.seed}-"))
    out.mkdir(parents=True, exist_ok=True)
    say(
        f"workload: mlp on digits, {work.epochs} epochs x {total // work.epochs} batches of {BATCH} = "
        f"{total} batches; central + {work.workers} workers, each {work.slowdown:g}x slower; lr 0.05 cosine; "
        f"seed {work.seed}; replication every {work.chain_every}/{work.global_every} batches; "
        f"{'workers in network namespaces' if isolated else 'loopback'}; output in {out}"
    )
    if not args.baseline_only:
        print_schedule(schedule, total)
    limit = 60 * args.time_limit
    baseline = faults = None
    with lab_network(work.worker_ids, isolated) as network:
        if not args.faults_only:
            say("== the fault-free arm ==")
            baseline = run_arm("fault-free", work, [], out / "fault-free", network, total=total, limit=limit)
            say(f"fault-free arm: {baseline.accuracy}, {baseline.seconds / 60:.1f} min {baseline.failed}")
        if not args.baseline_only:
            say("== the arm with faults ==")
            faults = run_arm("faults", work, schedule, out / "faults", network, total=total, limit=limit)
    say(f"logs, reports and audit files: {out}")
    wanted = 30  # the acceptance: at least 30 faults (a --quick run falls short of it, and says so)
    return summary(baseline, faults, kinds, wanted)


if __name__ == "__main__":
    sys.exit(main())
