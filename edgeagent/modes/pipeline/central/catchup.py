"""Recovery without a rollback (``--recovery-mode resume``): the dead stage brought forward, nobody else
goes back (the rule: :mod:`edgeagent.pipeline.catchup`; why and when: docs/design.md, "Recovery").

The central node replays the dead stage's lost batches itself, as its stage 0 holds half of what they
need (the activations it sent the dead stage 1) and it is where the run is coordinated:

1. It asks the stage after the dead one (``Resend``, with the probe when the fault named the dead
   device) to drop the dead stage's outputs still queued and send again the gradients it sent the dead
   stage; that stage then says ``Ready(phase="resent")`` with its version ``c``. Once the probe has
   found the recovery point's version ``v``, it fetches the dead stage's replica of ``v`` (from the
   chain successor that holds it, or from its own global replica).
2. It replays batches ``v .. c-1`` on the replica (:func:`~edgeagent.pipeline.catchup.catch_up`) and
   finishes the batches from its own committed id on with the input gradients that yields: stage 0
   reaches ``c`` too, committing them as if the dead stage had sent their gradients.
3. The caught-up layers go into its store as the dead device's snapshot at ``c``, and the recovery's
   switch re-splits at version ``c``: every device serves its own layers live, the central node the dead
   ones. Training resumes at batch ``c``; no batch goes through the pipeline twice.

Only where the central node holds the dead stage's inputs and its successor is the last stage: one dead
worker, stage 1 of 3 (the paper's scenario), in the pipeline mode (no hybrid stages, no sync schedule,
no aggregation or 2BW window, whose state no replica holds). Anything else, or a piece that does not
come within the wait, is a rollback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edgeagent.compression.stage import restore
from edgeagent.errors import EdgeAgentError
from edgeagent.modes.pipeline.central.context import RunState
from edgeagent.pipeline.build import make_stage
from edgeagent.pipeline.catchup import LostBatch, Pieces, catch_up
from edgeagent.planner.recovery import RecoveryPoint
from edgeagent.protocol.commands import Resend
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
    index = state.worker_list.index(device) if device in state.worker_list else -1
    if index != 1 or len(state.worker_list) != 3:
        # A stage after the successor could apply updates the successor has not: no version would be
        # every survivor's. Three stages (the paper's scenario) only.
        return f"the dead stage is {index} of {len(state.worker_list)}: only stage 1 of 3"
    if state.config.mode != "pipeline" or options.micro_batches:
        return f"--mode {state.config.mode} or the sync schedule"
    if options.staleness in ("aggregate", "2bw"):
        return f"--staleness {options.staleness} (its window is in no replica)"
    sent = state.runner.sent_activations  # consecutive batch ids: the oldest are dropped first
    if point.version < state.start_version or not sent or min(sent) > point.version:
        return f"the activations stage 0 sent since version {point.version} are no longer kept"
    return None


def ask_early(state: RunState, dead: list[str]) -> Pieces | None:
    """At the fault's detection, before the probe: when the fault names stage 1's device alone (its last
    will, its missed heartbeats), ask its successor to resend at once (everything it kept, the recovery
    point is not known yet), so that its answer travels with the probe's instead of after it. None when
    no catch-up can follow."""
    workers = state.worker_list
    sent = state.runner.sent_activations
    if state.config.recovery_mode != "resume" or len(workers) < 3 or dead != [workers[1]] or not sent:
        return None
    # From stage 0's newest snapshot: no recovery point is newer (every stage must serve it), and the
    # usual one is that (a replication point). The successor resends a few gradients instead of its whole
    # log, so its answer to the probe does not wait behind them; an older point asks again from there.
    newest = max(state.store.holdings().get(state.device_id, []), default=min(sent))
    return _ask(state, workers[1], max(min(sent), newest))


def _ask(state: RunState, device: str, since: int) -> Pieces:
    """Collect what the successor of dead stage 1 resends from batch ``since`` on (until :func:`release`)."""
    layers = list(range(state.points[1], state.points[2]))
    pieces = Pieces(device, "", state.worker_list[2], since, state.plan_id, layers)
    pieces.topics.append(state.topics.stage_filter(Family.GRADIENTS, 2))
    state.listen(pieces.topics[0])
    state.catchup = pieces
    state.send(
        state.topics.fixed(Family.COMMAND),
        Resend(run_id=state.run_id, device=pieces.successor, plan_id=state.plan_id, since=since),
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
        pieces.since, pieces.holder = point.version, point.sources[1]
        pieces.gradients = {b: g for b, g in pieces.gradients.items() if b >= point.version}
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
    if late is not None or pieces.version is None or pieces.weights is None:
        log.warning("recovery without a rollback: %s never came; rolling back", _missing(pieces))
        return None
    return _replay(state, pieces, pieces.version, finish, committed)


def _missing(pieces: Pieces) -> str:
    if pieces.weights is None:
        return f"the replica of {pieces.dead} from {pieces.holder}"
    if pieces.version is None:
        return f"{pieces.successor}'s resent gradients"
    return f"{pieces.successor}'s gradients of some batches from {pieces.since} to {pieces.version}"


def _replay(state: RunState, pieces: Pieces, until: int, finish: Finish, committed: int) -> int | None:
    """Replay the lost batches ``since .. until-1`` on the replica, finish stage 0's batches from
    ``committed + 1``, keep the caught-up layers as the dead device's snapshot at ``until``."""
    since, sent = pieces.since, state.runner.sent_activations
    if until <= committed or any(b not in sent for b in range(since, until)):
        log.warning(
            "recovery without a rollback: batches %d-%d are not all logged; rolling back", since, until
        )
        return None
    assert pieces.weights is not None
    try:
        stage = make_stage(
            state.spec, seed=state.train.seed, start=pieces.layers[0], end=pieces.layers[-1] + 1, index=1,
            num_stages=len(state.worker_list), options=state.options, weights=pieces.weights,
            momentum_buffers=pieces.momentum, version=since, in_flight=state.bound(),
        )  # fmt: skip
        lost = [
            LostBatch(b, restore(sent[b].x), sent[b].version, grad_output=restore(pieces.gradients[b].g))
            for b in range(since, until)
        ]
        clock = Clock(state.config.slowdown)
        grads = catch_up(stage, lost)
        seconds = emulate_slowdown(clock, state.config.slowdown, state.times)
    except EdgeAgentError as exc:
        log.warning("recovery without a rollback failed (%s); rolling back", exc)
        return None
    per_batch = seconds / max(1, len(lost))
    for b in range(committed + 1, until):
        owed, g = pieces.gradients[b], grads[b - since]
        assert g is not None
        finish(Gradient(
            run_id=owed.run_id, plan_id=owed.plan_id, stage=1, batch_id=b, g=g, loss=owed.loss,
            correct=owed.correct, stage_times=[per_batch, *owed.stage_times],
        ))  # fmt: skip
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
