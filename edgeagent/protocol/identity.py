"""Whose message is it: a message that names a device is taken only from that device. Pure, no I/O.

Note: three layers bind a message to the device that sent it (docs/protocol.md, "Identity").

1. **The topic.** Everything a device says about itself goes on a topic with its id in it:
   ``device/<id>/...`` (its announcement, status, replies, replicas...), ``stage/<s>/<kind>/<id>`` (the
   outputs it computed as stage ``s``) and ``link/<id>/<to>``. A broker ACL confines each login to its
   own id there: the embedded broker (:mod:`edgeagent.protocol.acl`) and Mosquitto's static ACL alike.
2. **The payload** (:func:`identity_problem`, on the network thread, before anything is queued): the
   envelope's sender and every device the body names as its author (``device_id``, a fetch's
   ``requester``, a probe's or link report's ``source``) must be the topic's device, and a stage output's
   own ``stage`` field the topic's stage. So a device that may publish only under its own id cannot
   speak for another one, whatever its payload says.
3. **The plan** (:class:`StageSenders`, on the role's thread, in order with the messages that change the
   plan): a stage output of the current plan is taken only from a device that holds that stage in it,
   so a device cannot inject activations, gradients, results or gradient sums for a stage it does not
   hold, even under a static ACL that lets it write every stage's topics under its own id.

A message that fails a check is dropped, counted (``sender`` in the role's drop counts) and logged with
the reason; the role goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from edgeagent.protocol.limits import sender_problem
from edgeagent.protocol.messages import Message
from edgeagent.protocol.topics import STAGE_OUTPUTS, Family, TopicInfo

# Body fields in which a message names the device that wrote it (on a topic of that device).
AUTHOR_FIELDS = ("device_id", "requester", "source")


def identity_problem(info: TopicInfo, sender: str, message: Message) -> str | None:
    """Why ``message`` (from envelope sender ``sender``) cannot have come from the device its topic names,
    or None. Topics without a device (``run/...``, ``discovery/request``) are not checked here."""
    device = info.device
    if device is None:
        return None
    problem = sender_problem(info, sender)  # a device's own topics and links
    if problem is not None:
        return problem
    where = f"{info.family.value} topic of {device!r}"
    if info.family in STAGE_OUTPUTS and sender != device:
        return f"sender {sender!r} on the {where}: only {device!r} publishes there"
    for name in AUTHOR_FIELDS:
        named = getattr(message, name, None)
        if isinstance(named, str) and named != device:
            return f"{message.KIND.value}.{name} {named!r} on the {where}: a device speaks only for itself"
    stage = getattr(message, "stage", None)
    # Input rows (``stage/0/input``) are the data's, the stage before stage 0: ``stage`` -1.
    expected = info.stage - 1 if info.stage is not None and info.family is Family.INPUTS else info.stage
    if info.stage is not None and isinstance(stage, int) and stage != expected:
        if info.family is Family.INPUTS:
            return (
                f"{message.KIND.value} of stage {stage} as stage {info.stage}'s input rows (stage {expected})"
            )
        return f"{message.KIND.value} of stage {stage} on the topic of stage {info.stage}"
    return None


@dataclass(frozen=True)
class PlanView:
    """A run's current plan as a receiver sees it: per stage, the devices that hold it now."""

    run_id: str
    plan_id: int
    groups: Sequence[Sequence[str]]


@runtime_checkable
class HasPlan(Protocol):
    """A run (a worker's session, the central node's run) whose mode uses the stage topics."""

    def plan_view(self) -> PlanView | None: ...


class StageSenders:
    """Whose stage outputs a role takes: those of the devices that hold the stage in the run's current plan.

    ``plan`` is set by the run in progress (None: no run, or a mode without stage topics). A stage's
    devices are remembered for the plan's lifetime: a hybrid stage's failover removes members inside a
    plan, and the pieces they computed before it may still arrive and count
    (:func:`edgeagent.pipeline.groups.cover`), so a run calls :meth:`see` before it changes a plan's
    groups. Messages of another run or plan are left to the handlers (they drop them as stale).
    """

    def __init__(self) -> None:
        self.plan: Callable[[], PlanView | None] | None = None
        self._key: tuple[str, int] | None = None
        self._held: list[set[str]] = []

    def see(self, view: PlanView | None) -> None:
        """Remember the devices of every stage of ``view``'s plan (with those seen before in that plan)."""
        if view is None:
            return
        key = (view.run_id, view.plan_id)
        if key != self._key:
            self._key, self._held = key, [set(g) for g in view.groups]
            return
        for k, group in enumerate(view.groups):
            if k < len(self._held):
                self._held[k].update(group)
            else:
                self._held.append(set(group))

    def problem(self, info: TopicInfo, message: Message) -> str | None:
        """Why a stage output may not be taken from its topic's device in the current plan, or None."""
        if info.stage is None or info.device is None or self.plan is None:
            return None
        view = self.plan()
        run_id, plan_id = getattr(message, "run_id", None), getattr(message, "plan_id", None)
        if view is None or (run_id, plan_id) != (view.run_id, view.plan_id):
            return None
        self.see(view)
        held = self._held[info.stage] if info.stage < len(self._held) else set()
        if info.device in held:
            return None
        return (
            f"{info.device!r} does not hold stage {info.stage} in plan {plan_id} "
            f"(held by {sorted(held) or 'nobody'})"
        )


__all__ = ["AUTHOR_FIELDS", "HasPlan", "PlanView", "StageSenders", "identity_problem"]
