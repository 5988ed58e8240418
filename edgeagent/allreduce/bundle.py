"""Fewer messages per step (issue 54): a collective's metadata messages folded into the message before
them to the same device, in one batch of sends (pure).

The ft-tree's metadata messages (``meta_*``) carry nothing but a kind and a target, and a node often sends
several at once to one device, or right after a data message to it: the parent that sends the last chunk
of the mean to a child also tells that child that it sent the mean to its brother (``meta_bcast_sent``);
a node that sends its sum up tells its brother both that it received a child's sum and that it sent its
own. :func:`bundle` folds each such metadata message into the message before it in the batch to the same
device, as a ``(kind, target)`` note; :func:`unbundle` gives the receiver the messages back, in their
order (the carrier first, then its notes), so the collective handles exactly what it would have without
bundling, only in fewer messages: the same timeouts, the same mean, bit for bit.

Note: only messages of one batch (what one call of ``start``, ``receive`` or ``tick`` returned) are
folded, so nothing waits for a later message to ride on; a failed link drops a carrier with its notes,
as it would have dropped each of them. The paper's exchange (``ft-tree-thesis``) is run unbundled, as
the thesis describes it (:data:`edgeagent.allreduce.BUNDLED`).
"""

from __future__ import annotations

import dataclasses

from edgeagent.allreduce.base import CollectiveMsg, Send

MAX_NOTES = 64
"""Notes at most on one message (checked on decode); a batch folds only a few (6 in a 7-node ft-tree)."""


def is_note(msg: CollectiveMsg) -> bool:
    """Whether ``msg`` is a bare metadata message: nothing but its kind, step, sender and target."""
    return (
        msg.data is None
        and msg.origin is None
        and not msg.contributors
        and (msg.chunk, msg.chunks) == (0, 1)
        and not msg.notes
    )


def bundle(sends: list[Send]) -> list[Send]:
    """``sends`` with every bare metadata message folded into the message before it to the same device
    (see the module doc); the others unchanged, in their order."""
    out: list[Send] = []
    last: dict[int, int] = {}  # device -> index in ``out`` of the latest message to it
    for s in sends:
        i = last.get(s.to)
        if i is not None and is_note(s.msg):
            carrier = out[i].msg
            same = carrier.step == s.msg.step and carrier.sender == s.msg.sender
            if same and len(carrier.notes) < MAX_NOTES:
                notes = (*carrier.notes, (s.msg.kind, s.msg.target))
                out[i] = Send(s.to, dataclasses.replace(carrier, notes=notes))
                continue
        last[s.to] = len(out)
        out.append(s)
    return out


def unbundle(msg: CollectiveMsg) -> list[CollectiveMsg]:
    """The messages ``msg`` carries: itself (without its notes), then one metadata message per note."""
    if not msg.notes:
        return [msg]
    return [
        dataclasses.replace(msg, notes=()),
        *(CollectiveMsg(kind, msg.step, msg.sender, target=target) for kind, target in msg.notes),
    ]


__all__ = ["MAX_NOTES", "bundle", "is_note", "unbundle"]
