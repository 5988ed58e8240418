"""The run's message handlers, one per message type, registered on the node's runtime (``Role.on``).

Each handler only records what arrived (a gradient, a result, a phase, a replica); the waits of the
run (:meth:`Role.wait_until`) look at what was recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edgeagent.errors import TrainingError
from edgeagent.modes.pipeline.central.checkpoint import Checkpoints
from edgeagent.modes.pipeline.central.context import RunState
from edgeagent.modes.pipeline.central.estimation import Estimation
from edgeagent.protocol.messages import (
    Activation,
    Announce,
    ErrorReport,
    EvalResult,
    FetchRequest,
    Gradient,
    LinkReport,
    Message,
    Ready,
    Status,
    Weights,
)
from edgeagent.protocol.topics import Family
from edgeagent.replication.store import layer_of
from edgeagent.replication.switch import serve_fetch
from edgeagent.runtime.role import Inbound

log = logging.getLogger("edgeagent.roles.central")


class Handlers:
    """What the run does with each message type (see :meth:`handlers`)."""

    def __init__(self, state: RunState, estimation: Estimation, checkpoints: Checkpoints) -> None:
        self.state = state
        self.estimation = estimation
        self.checkpoints = checkpoints

    def handlers(self) -> dict[type[Message], Callable[[Inbound], None]]:
        return {
            Gradient: self.on_gradient,
            Activation: self.on_activation,
            EvalResult: self.on_eval_result,
            Status: self.on_status,
            Ready: self.on_ready,
            LinkReport: self.on_link_report,
            FetchRequest: self.on_fetch,
            Weights: self.on_weights,
            Announce: self.on_announce,
            ErrorReport: self.on_error,
        }

    def _ours(self, msg: Message) -> bool:
        return getattr(msg, "run_id", None) == self.state.run_id

    def _member(self, item: Inbound, device: str) -> bool:
        """Whether ``device`` (the topic's: identity is checked on arrival) is one of the run's devices,
        discovered or joined since; a message about the run from any other is dropped with a line."""
        state = self.state
        if device in state.workers:
            return True
        state.node.discard(item, f"{device!r} is not a device of run {state.run_id}")
        return False

    def on_gradient(self, item: Inbound) -> None:
        state = self.state
        msg = item.message
        assert isinstance(msg, Gradient)
        if not self._ours(msg) or msg.plan_id != state.plan_id:
            return  # a stale gradient of an earlier run or plan
        if state.catchup is not None and state.catchup.accept_gradient(msg):
            return  # the stage after a dead one resent it (central/catchup.py)
        grad, problem = state.runner.take_gradient(msg)
        if grad is None:
            state.node.discard(item, problem or "")
            return
        state.inbox.gradients[grad.batch_id] = grad

    def on_activation(self, item: Inbound) -> None:
        """The stage before a dead one resent what it sent it (central/catchup.py); nothing else comes."""
        state = self.state
        msg = item.message
        assert isinstance(msg, Activation)
        if self._ours(msg) and state.catchup is not None:
            state.catchup.accept_activation(msg)  # a tensor that does not fit fails the replay: a rollback

    def on_eval_result(self, item: Inbound) -> None:
        state = self.state
        msg = item.message
        assert isinstance(msg, EvalResult)
        if not self._ours(msg) or msg.plan_id != state.plan_id:
            return
        if msg.batch_id not in state.inbox.eval_ids:
            if state.inbox.eval_ids:  # else a late duplicate of an evaluation that is over
                state.node.discard(item, f"no evaluation batch {msg.batch_id} is out")
            return
        self._take_result(msg)

    def _take_result(self, msg: EvalResult) -> None:
        """An evaluation batch's result is in (the hybrid mode adds up the pieces of a batch first)."""
        self.state.inbox.results[msg.batch_id] = msg

    def on_status(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Status)
        state = self.state
        w = state.workers.get(msg.device_id)
        if w is not None and msg.state == "offline" and not w.online:
            log.warning("worker %s went offline (last will)", msg.device_id)
        if msg.state in ("offline", "left") and msg.device_id in state.joiners:
            # Announced, not admitted yet, and gone: no plan waits for it (it announces itself again).
            state.joiners.remove(msg.device_id)
            log.warning("%s went %s before it could join; it is not planned with", msg.device_id, msg.state)

    def on_ready(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Ready)
        if not self._ours(msg) or not self._member(item, msg.device_id):
            return
        if msg.phase == "alive":
            self.state.inbox.alive[msg.device_id] = msg
        elif msg.phase == "resent":
            if self.state.catchup is not None:
                self.state.catchup.resent(msg)
        else:
            self.state.inbox.ready.setdefault(msg.plan_id, {})[msg.device_id] = msg.phase

    def on_link_report(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, LinkReport)
        if self._ours(msg):
            self.state.inbox.links[msg.source] = msg

    def on_fetch(self, item: Inbound) -> None:
        state = self.state
        msg = item.message
        assert isinstance(msg, FetchRequest)
        if not self._ours(msg) or msg.owner != state.device_id or not self._member(item, msg.requester):
            return
        try:
            reply = serve_fetch(
                state.store,
                state.runner.stage,
                msg,
                state.spec,
                state.train.seed,
                state.run_id,
            )
        except TrainingError as exc:
            log.error("cannot serve %s's fetch of layers %s: %s", msg.requester, msg.layers, exc)
            return
        state.send(state.topics.device(Family.REPLICA, state.device_id), reply)

    def on_weights(self, item: Inbound) -> None:
        state = self.state
        msg = item.message
        assert isinstance(msg, Weights)
        if not self._ours(msg) or not self._member(item, msg.device_id):
            return
        if msg.purpose == "redistribute":
            if state.switch is not None:
                state.switch.accept(msg)
            elif state.catchup is not None:
                state.catchup.accept_weights(msg)
        elif msg.purpose == "collect":
            problem = self._collect_problem(msg)
            if problem is not None:
                state.node.discard(item, problem)
            else:
                state.inbox.weights[msg.device_id] = msg
        elif msg.purpose in ("chain", "global") and msg.plan_id == state.plan_id:
            try:
                state.store.add_replica(msg)
            except TrainingError as exc:
                log.warning("%s", exc)
                return
            self.checkpoints.replicated(msg)
            self.checkpoints.maybe_checkpoint(msg.version)

    def _collect_problem(self, msg: Weights) -> str | None:
        """Why a device's answer to ``collect`` cannot go into the trained model, or None: only the layers of
        the stage it holds, as that stage."""
        state = self.state
        stage = state.groups.stage_of(msg.device_id)
        if stage is None or stage != msg.stage:
            return f"collect of stage {msg.stage} from {msg.device_id!r}, which holds stage {stage}"
        start, end = state.points[stage], state.points[stage + 1]
        try:
            outside = sorted({key for key in msg.tensors if not start <= layer_of(key) < end})
        except (IndexError, ValueError):
            return f"collect from {msg.device_id!r} with tensors not named layers.<layer>.<name>"
        if outside:
            held = f"stage {stage}, layers [{start}, {end})"
            return f"collect from {msg.device_id!r} ({held}) holds {outside[:3]}"
        return None

    def on_announce(self, item: Inbound) -> None:
        state = self.state
        msg = item.message
        assert isinstance(msg, Announce)
        state.node.remember(msg, keep=state.worker_list)
        if msg.h and msg.busy_with in ("", state.run_id):
            self.estimation.on_h(msg)
        joinable = state.train_started and not msg.busy_with
        new = msg.device_id not in state.worker_list and msg.device_id not in state.joiners
        if joinable and new and state.resplits:
            state.joiners.append(msg.device_id)
            log.info("%s is available; it joins at the next re-partition", msg.device_id)
            self.estimation.ask_h(msg.device_id)

    def on_error(self, item: Inbound) -> None:
        state = self.state
        msg = item.message
        assert isinstance(msg, ErrorReport)
        if self._ours(msg) and not self._member(item, msg.device_id):
            return  # another device cannot end this run
        if msg.code == "nonfinite":  # a worker dropped what another device sent (logged there)
            if self._ours(msg) and msg.about:
                state.node.nonfinite[msg.about] += 1
            log.warning("worker %s %s", msg.device_id, msg.reason)
            return
        log.error("worker %s reports %s: %s", msg.device_id, msg.code, msg.reason)
        if self._ours(msg) and msg.code == "diverged" and msg.device_id in state.worker_list:
            state.inbox.diverged = msg.reason
        elif self._ours(msg):
            state.inbox.error = f"worker {msg.device_id} failed: {msg.reason}"
