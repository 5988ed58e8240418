"""Recovery without a rollback (``--recovery-mode resume``): the dead stage brought forward, nobody else
goes back (the rule: :mod:`edgeagent.pipeline.catchup`; why and when: docs/design.md, "Recovery").

The central node replays the dead stage ``i``'s lost batches itself, as it is where the run is
coordinated (and, for ``i = 1``, its stage 0 holds the dead stage's inputs):

1. It asks the stage after the dead one, if any (``Resend``, with the probe when the fault named the
   dead device), to drop the dead stage's outputs still queued, wait until every batch it sent on came
   back and send again the gradients it sent the dead stage; that stage then says
   ``Ready(phase="resent")`` with its version ``c``. It asks the stage before (``Resend`` of its
   activations; stage 0's are in the central node's own log) to send again the activations it sent the
   dead stage, labels included; that stage says how far it sent (``c`` when the dead stage is the last:
   the replay computes the loss of every batch it was sent). Once the probe has found the recovery
   point's version ``v``, it fetches the dead stage's replica of ``v`` (from the chain successor that
   holds it, or from its own global replica).
2. It replays batches ``v .. c-1`` on the replica (:func:`~edgeagent.pipeline.catchup.replay`). The
   input gradients that yields finish the batches the stage before had in flight: stage 0's directly;
   a worker's are sent to it as the dead stage's gradients, and its own then travel back to stage 0 as
   usual. Every stage reaches ``c``, stage 0 committing the batches up to ``c - 1``.
3. The caught-up layers go into its store as the dead device's snapshot at ``c``, and the recovery's
   switch re-splits at version ``c``: every device serves its own layers live, the central node the dead
   ones. Training resumes at batch ``c``; no batch goes through the pipeline twice.

One dead worker, any stage, in the pipeline mode (no hybrid stages, no sync schedule, no aggregation or
2BW window, whose state no replica holds). Anything else, or a piece that does not come within the
wait, is a rollback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edgeagent.compression.stage import restore
from edgeagent.errors import EdgeAgentError
from edgeagent.modes.pipeline.central.context import RunState
from edgeagent.pipeline.build import make_stage
from edgeagent.pipeline.catchup import LostBatch, Pieces, replay
from edgeagent.planner.recovery import RecoveryPoint
from edgeagent.protocol.commands import Resend, ResendKind
from edgeagent.protocol.messages import FetchRequest, Gradient
from edgeagent.protocol.topics import Family
from edgeagent.replication.store import Snapshot
from edgeagent.runtime.compute import Clock, emulate_slowdown

log = logging.getLogger("edgeagent.roles.central")

Finish = Callable[[Gradient], None]
"""The training loop's backward of its oldest batch in flight, with the gradient the dead stage owed."""


def eligible(state: RunState, dead: set[str], point: RecoveryPoint) -> str | None:
    """Why this fault needs a rollback, or None: the catch-up can bring the dead stage forward."""
    options = state.options
    if state.config.recovery_mode != "resume":
        return "--recovery-mode rollback"
    if len(dead) != 1:
        return f"{len(dead)} devices lost"
    (device,) = dead
    if device not in state.worker_list[1:]:
        return f"{device} holds no stage"
    if state.config.mode != "pipeline" or options.micro_batches:
        return f"--mode {state.config.mode} or the sync schedule"
    if options.staleness in ("aggregate", "2bw"):
        return f"--staleness {options.staleness} (its window is in no replica)"
    sent = state.runner.sent_activations  # consecutive batch ids: the oldest are dropped first
    if state.worker_list.index(device) == 1 and (
        point.version < state.start_version or not sent or min(sent) > point.version
    ):
        return f"the activations stage 0 sent since version {point.version} are no longer kept"
    return None


def ask_early(state: RunState, dead: list[str]) -> Pieces | None:
    """At the fault's detection, before the probe: when the fault names one stage's device alone (its
    last will, its missed heartbeats), ask its neighbours to resend at once (the recovery point is not
    known yet), so that their answers travel with the probe's instead of after it. None when no catch-up
    can follow."""
    workers = state.worker_list
    sent = state.runner.sent_activations
    if state.config.recovery_mode != "resume" or len(dead) != 1 or dead[0] not in workers[1:]:
        return None
    if workers.index(dead[0]) == 1 and not sent:
        return None
    # From stage 0's newest snapshot: no recovery point is newer (every stage must serve it), and the
    # usual one is that (a replication point). The neighbours resend a few messages instead of their whole
    # logs, so their answers to the probe do not wait behind them; an older point asks again from there.
    newest = max(state.store.holdings().get(state.device_id, []), default=min(sent, default=0))
    return _ask(state, dead[0], max(min(sent, default=0), newest))


def _ask(state: RunState, device: str, since: int) -> Pieces:
    """Collect what the neighbours of the dead ``device`` resend from batch ``since`` on (until
    :func:`release`)."""
    workers, i = state.worker_list, state.worker_list.index(device)
    layers = list(range(state.points[i], state.points[i + 1]))
    successor = workers[i + 1] if i + 1 < len(workers) else None
    predecessor = workers[i - 1] if i > 1 else None
    pieces = Pieces(device, i, "", successor, predecessor, since, state.plan_id, layers)
    if predecessor is None:  # stage 0: its own log, and it has sent what it has sent
        sent = state.runner.sent_activations
        pieces.activations = {b: a for b, a in sent.items() if b >= since}
        pieces.sent = max(sent, default=-1) + 1
    state.catchup = pieces
    asks: list[tuple[str | None, int, Family, ResendKind]] = [
        (successor, i + 1, Family.GRADIENTS, "gradients"),
        (predecessor, i - 1, Family.ACTIVATIONS, "activations"),
    ]
    for neighbour, stage, family, kind in asks:
        if neighbour is None:
            continue
        pieces.topics.append(state.topics.stage_filter(family, stage))
        state.listen(pieces.topics[-1])
        state.send(
            state.topics.fixed(Family.COMMAND),
            Resend(run_id=state.run_id, device=neighbour, plan_id=state.plan_id, since=since, kind=kind),
        )
    return pieces


def release(state: RunState, pieces: Pieces | None) -> None:
    """Stop collecting for a catch-up."""
    if pieces is None:
        return
    state.catchup = None
    for pattern in pieces.topics:
        state.stop_listening(pattern)
    pieces.topics.clear()


def bring_forward(
    state: RunState,
    asked: Pieces | None,
    device: str,
    point: RecoveryPoint,
    finish: Finish,
    committed: int,
    timeout: float,
) -> int | None:
    """Bring dead stage 1 (``device``) forward from ``point`` (see the module doc; ``asked``: what
    :func:`ask_early` started); return the version every stage is at afterwards (training resumes there),
    or None when a piece did not come (roll back)."""
    pieces = asked
    if pieces is None or pieces.dead != device or pieces.since > point.version:
        release(state, pieces)
        pieces = _ask(state, device, point.version)
    try:
        pieces.since, pieces.holder = point.version, point.sources[pieces.stage]
        pieces.gradients = {b: g for b, g in pieces.gradients.items() if b >= point.version}
        pieces.activations = {b: a for b, a in pieces.activations.items() if b >= point.version}
        if pieces.holder == state.device_id:
            pieces.weights, pieces.momentum = state.store.get(
                device, point.version, pieces.layers, live=None, spec=state.spec, seed=state.train.seed
            )
        else:
            pieces.topics.append(state.topics.device(Family.REPLICA, pieces.holder))
            state.listen(pieces.topics[-1])
            state.send(
                state.topics.device(Family.REQUEST, state.device_id),
                FetchRequest(
                    run_id=state.run_id, plan_id=state.plan_id, requester=state.device_id,
                    owner=pieces.holder, layers=pieces.layers, version=point.version, of_device=device,
                ),
            )  # fmt: skip
        late = state.node.wait_until(
            lambda: pieces.complete, timeout, "the catch-up's pieces", poll=0.01, expired=lambda why: why
        )
    finally:
        release(state, pieces)
    until = pieces.until
    if late is not None or until is None or pieces.weights is None:
        log.warning("recovery without a rollback: %s never came; rolling back", _missing(pieces))
        return None
    return _replay(state, pieces, until, finish, committed, timeout)


def _missing(pieces: Pieces) -> str:
    if pieces.weights is None:
        return f"the replica of {pieces.dead} from {pieces.holder}"
    if pieces.successor is not None and pieces.version is None:
        return f"{pieces.successor}'s resent gradients"
    if pieces.predecessor is not None and pieces.before is None:
        return f"{pieces.predecessor}'s resent activations"
    return f"what {pieces.dead}'s neighbours sent it for some batches from {pieces.since} to {pieces.until}"


def _replay(
    state: RunState, pieces: Pieces, until: int, finish: Finish, committed: int, timeout: float
) -> int | None:
    """Replay the lost batches ``since .. until-1`` on the replica, finish the stage before's batches in
    flight (and through them stage 0's from ``committed + 1``), keep the caught-up layers as the dead
    device's snapshot at ``until``."""
    since, sent, last = pieces.since, pieces.activations, pieces.successor is None
    if until <= committed or any(b not in sent for b in range(since, until)):
        log.warning(
            "recovery without a rollback: batches %d-%d are not all logged; rolling back", since, until
        )
        return None
    assert pieces.weights is not None
    try:
        stage = make_stage(
            state.spec, seed=state.train.seed, start=pieces.layers[0], end=pieces.layers[-1] + 1,
            index=pieces.stage, num_stages=len(state.worker_list), options=state.options,
            weights=pieces.weights, momentum_buffers=pieces.momentum, version=since, in_flight=state.bound(),
        )  # fmt: skip
        lost = [
            LostBatch(
                b, restore(sent[b].x), sent[b].version,
                grad_output=None if last else restore(pieces.gradients[b].g),
                labels=sent[b].y if last else None,
            )
            for b in range(since, until)
        ]  # fmt: skip
        clock = Clock(state.config.slowdown)
        results = replay(stage, lost)
        seconds = emulate_slowdown(clock, state.config.slowdown, state.times)
    except (EdgeAgentError, RuntimeError, ValueError) as exc:  # RuntimeError: a resent tensor did not fit
        log.warning("recovery without a rollback failed (%s); rolling back", exc)
        return None
    per_batch = seconds / max(1, len(lost))
    owed: list[Gradient] = []
    for b, result in zip(range(since, until), results, strict=True):
        assert result.grad_input is not None
        before = pieces.gradients.get(b)
        loss, correct = (result.loss, result.correct) if before is None else (before.loss, before.correct)
        owed.append(Gradient(
            run_id=state.run_id, plan_id=pieces.plan_id, stage=pieces.stage, batch_id=b, g=result.grad_input,
            loss=loss, correct=correct, stage_times=[per_batch, *(before.stage_times if before else [])],
        ))  # fmt: skip
    if pieces.predecessor is None:
        for grad in owed[committed + 1 - since :]:
            finish(grad)
    elif not _finish_through(state, pieces, owed, finish, committed, timeout):
        return None
    weights, momentum = stage.export(pieces.layers)
    state.store.put(pieces.dead, Snapshot(until, pieces.layers[0], pieces.layers[-1] + 1, weights, momentum))
    log.warning(
        "recovery without a rollback: %s's layers %s brought from version %d to %d (%d batches replayed on "
        "them alone, %.3f s)",
        pieces.dead,
        [pieces.layers[0], pieces.layers[-1] + 1],
        since,
        until,
        len(lost),
        seconds,
    )
    return until


def _finish_through(
    state: RunState, pieces: Pieces, owed: list[Gradient], finish: Finish, committed: int, timeout: float
) -> bool:
    """Send the stage before the dead one (a worker) the gradients it waits for, as the dead stage would
    have; its own travel back to stage 0, whose batches from ``committed + 1`` then finish here. False when
    they do not all come back (the stages between cannot serve the version the switch names)."""
    assert pieces.before is not None
    topic = state.topics.gradients(pieces.stage, state.device_id)
    for grad in owed:
        if grad.batch_id >= pieces.before:
            state.send(topic, grad)
    inbox, until = state.inbox.gradients, owed[-1].batch_id + 1 if owed else pieces.since
    late = state.node.wait_until(
        lambda: all(b in inbox for b in range(committed + 1, until)), timeout,
        "stage 1's gradients after the catch-up", poll=0.01, expired=lambda why: why,
    )  # fmt: skip
    if late is not None:
        log.warning("recovery without a rollback: %s; rolling back", late)
        return False
    for b in range(committed + 1, until):
        finish(inbox.pop(b))
    return True
