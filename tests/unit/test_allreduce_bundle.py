"""Metadata folded into fewer messages (issue 54, :mod:`edgeagent.allreduce.bundle`): the receiver gets
exactly the messages it would have got, in their order; the ft-tree's mean, its timeouts and its counts of
each kind are those of the unbundled exchange, with and without failed links; the notes cross the wire
checked; a chunk of :data:`~edgeagent.allreduce.chunks.CHUNK_FLOATS` is one MQTT frame."""

from __future__ import annotations

import pytest
import torch

from edgeagent.allreduce import bundle as bundle_mod
from edgeagent.allreduce.base import CollectiveMsg, Send
from edgeagent.allreduce.bundle import MAX_NOTES, bundle, is_note, unbundle
from edgeagent.allreduce.chunks import CHUNK_FLOATS
from edgeagent.allreduce.ft_tree import FtTreeAllreduce, Variant
from edgeagent.allreduce.sim import FAULTS, FixedTimeouts, run_step
from edgeagent.errors import ProtocolError
from edgeagent.modes.allreduce import messages
from edgeagent.modes.allreduce.messages import AllreduceMsg
from edgeagent.protocol.chunking import DEFAULT_CHUNK_SIZE
from edgeagent.protocol.wire import decode, encode


def meta(kind: str, sender: int, target: int | None = None, step: int = 0) -> CollectiveMsg:
    return CollectiveMsg(kind, step, sender, target=target)


def data(sender: int, chunk: int = 0) -> CollectiveMsg:
    return CollectiveMsg("data_bcast", 0, sender, sender, None, (0, 1, 2), torch.ones(2), chunk, 2)


def per_device(sends: list[Send]) -> dict[int, list[CollectiveMsg]]:
    out: dict[int, list[CollectiveMsg]] = {}
    for s in sends:
        out.setdefault(s.to, []).extend(unbundle(s.msg))
    return out


def test_bundle_folds_metadata_into_the_message_before_it_to_the_same_device() -> None:
    sends = [
        Send(3, data(1, 0)),
        Send(2, meta("meta_reduce_received", 1, 3)),
        Send(3, data(1, 1)),
        Send(2, meta("meta_reduce_sent", 1, 0)),
        Send(3, meta("meta_bcast_sent", 1, 4)),
        Send(4, meta("meta_bcast_sent", 1, 3)),
        Send(2, meta("meta_bcast_received", 1)),
    ]
    out = bundle(sends)
    assert [(s.to, s.msg.kind, s.msg.chunk, s.msg.notes) for s in out] == [
        (3, "data_bcast", 0, ()),
        (2, "meta_reduce_received", 0, (("meta_reduce_sent", 0), ("meta_bcast_received", None))),
        (3, "data_bcast", 1, (("meta_bcast_sent", 4),)),
        (4, "meta_bcast_sent", 0, ()),
    ]
    assert per_device(out) == per_device(sends)  # each device: the same messages, in the same order
    assert torch.equal(out[2].msg.data, sends[2].msg.data)  # type: ignore[arg-type]
    assert unbundle(out[0].msg) == [out[0].msg]


def test_bundle_keeps_apart_what_is_not_bare_metadata_or_of_another_step() -> None:
    sends = [
        Send(2, meta("meta_reduce_request", 1)),
        Send(2, data(1)),  # data never rides on another message
        Send(2, meta("meta_reduce_sent", 1, 0, step=5)),  # another step's
        Send(2, CollectiveMsg("meta_reduce_sent", 0, 1, origin=3)),  # more than kind and target
    ]
    assert not is_note(sends[1].msg) and not is_note(sends[3].msg)
    assert bundle(sends) == sends
    many = [Send(1, meta("meta_bcast_received", 0))] * (MAX_NOTES + 2)
    out = bundle(many)
    assert [len(s.msg.notes) for s in out] == [MAX_NOTES, 0]
    assert per_device(out) == per_device(many)


def grads_for(n: int, seed: int, dim: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(dim, generator=g) * 10.0 ** torch.randint(-4, 4, (dim,), generator=g) for _ in range(n)
    ]


@pytest.mark.parametrize("variant", ["proactive", "thesis"])
@pytest.mark.parametrize("chunk_floats", [None, 4])
def test_bundled_ft_tree_is_the_same_exchange_in_fewer_messages(
    variant: Variant, chunk_floats: int | None
) -> None:
    for n in (7, 10, 15):
        grads = grads_for(n, 900 + n, dim=13)
        for case, links in FAULTS.items():
            for jitter, seed in ((0.0, 0), (20.0, n)):
                runs = []
                for bundled in (False, True):
                    coll = [
                        FtTreeAllreduce(
                            r, n, 0, FixedTimeouts(0.5), variant=variant, chunk_floats=chunk_floats
                        )
                        for r in range(n)
                    ]
                    runs.append(
                        run_step(coll, grads, failed_links=links, jitter=jitter, seed=seed, bundled=bundled)
                    )
                plain, bundled_run = runs
                assert bundled_run.all_done and bundled_run.completion_time is not None, (n, case)
                for r in range(n):
                    assert torch.equal(bundled_run.results[r], plain.results[0]), (n, case, r)  # type: ignore[arg-type]
                assert bundled_run.contributors == plain.contributors
                if jitter == 0.0:  # the same messages of each kind
                    assert bundled_run.sent == plain.sent, (n, case)
                assert plain.messages == sum(plain.sent.values())
                assert bundled_run.messages < plain.messages, (n, case)


def test_seven_devices_fault_free_send_a_third_fewer_metadata_messages() -> None:
    grads = grads_for(7, 1, dim=12)
    runs = [
        run_step(
            [FtTreeAllreduce(r, 7, 0, FixedTimeouts(0.5), chunk_floats=4) for r in range(7)], grads, bundled=b
        )
        for b in (False, True)
    ]
    metadata = sum(v for k, v in runs[0].sent.items() if k.startswith("meta_"))
    assert metadata == 40
    assert runs[0].messages - runs[1].messages == 12  # 40 metadata messages travel in 28


def test_notes_cross_the_wire_checked() -> None:
    msg = AllreduceMsg(
        run_id="run-1",
        step=3,
        attempt=0,
        kind="data_bcast",
        sender=1,
        origin=1,
        contributors=[0, 1, 2],
        data=torch.ones(4),
        chunk=1,
        chunks=3,
        notes=["meta_bcast_sent", "meta_bcast_received"],
        note_targets=[4, -1],
    )
    sender, back = decode(encode(msg, sender="worker-2"))
    assert sender == "worker-2" and isinstance(back, AllreduceMsg)
    assert back.notes == msg.notes and back.note_targets == msg.note_targets
    assert messages.MAX_NOTES == bundle_mod.MAX_NOTES
    base = {"run_id": "r", "step": 0, "attempt": 0, "kind": "meta_reduce_sent", "sender": 1}
    for bad in (
        {"notes": ["meta_bcast_sent"], "note_targets": []},
        {"notes": ["m"] * (MAX_NOTES + 1), "note_targets": [0] * (MAX_NOTES + 1)},
        {"notes": [""], "note_targets": [0]},
        {"notes": ["meta_bcast_sent"], "note_targets": [-2]},
    ):
        with pytest.raises(ProtocolError):
            AllreduceMsg(**base, **bad)  # type: ignore[arg-type]


def test_a_chunk_is_one_frame() -> None:
    msg = AllreduceMsg(
        run_id="r" * 36,
        step=10**9,
        attempt=10**6,
        kind="data_reduce_request",
        sender=4095,
        origin=4095,
        target=4095,
        contributors=list(range(4096 - 64, 4096)),
        data=torch.ones(CHUNK_FLOATS),
        ts=1e9,
        echo=1e9,
        echo_delay=1.5,
        chunk=1023,
        chunks=1024,
        notes=["meta_bcast_received"] * 8,
        note_targets=[4095] * 8,
    )
    assert len(encode(msg, sender="w" * 64)) <= DEFAULT_CHUNK_SIZE
