"""Chunk reassembly is bounded per source before anything is buffered (issue 49), on a real broker.

Chunks are put back together before a role's inbox limits see the message. A flood of first chunks on
one topic (partial messages that never complete, each announcing a few hundred kB) must neither grow
the receiver's memory beyond that source's share nor push out another source's message that is being
put together meanwhile.
"""

from __future__ import annotations

import random

from edgeagent.protocol.chunking import split_payload
from tests.protocol.test_brokers import PROBE, Collector, confirm_subscription, transports, wait_until

FLOOD = 200  # partial messages from the flooding topic
CHUNK = 64 * 1024


def test_a_flood_of_partial_messages_from_one_source_is_bounded_and_the_others_get_through(
    broker_url: str, cluster: str
) -> None:
    flood_topic, legit_topic = f"{cluster}/flood", f"{cluster}/legit"
    legit = random.Random(7).randbytes(5 * CHUNK)
    legit_frames = split_payload(legit, CHUNK)
    with transports(broker_url, "tx", "rx") as (sender, receiver):
        legit_in, flood_in = Collector(), Collector()  # nothing from the flood ever completes
        receiver.subscribe(legit_topic, legit_in)
        receiver.subscribe(flood_topic, flood_in)
        confirm_subscription(sender, legit_topic, lambda: PROBE in legit_in.payloads())
        confirm_subscription(sender, flood_topic, lambda: PROBE in flood_in.payloads())
        # The legit message's first chunk, then the flood (each the first chunk of a message that never
        # ends), then the rest of the legit message.
        sender.publish(legit_topic, legit_frames[0])
        for i in range(FLOOD):
            first = split_payload(random.Random(i).randbytes(3 * CHUNK), CHUNK)[0]
            sender.publish(flood_topic, first)
        for frame in legit_frames[1:]:
            sender.publish(legit_topic, frame)
        whole = legit_in.wait_for(lambda p: p != PROBE, 30)
        assert whole == legit, "the other source's message was pushed out by the flood"
        reassembler = receiver._reassembler
        share = reassembler.max_pending_per_source

        def every_frame_in() -> bool:
            return receiver.dropped + reassembler.pending_from(flood_topic) >= FLOOD

        assert wait_until(every_frame_in, 30), f"{receiver.dropped} dropped, {reassembler.pending} pending"
        assert reassembler.pending_from(flood_topic) == share
        assert receiver.dropped == FLOOD - share  # refused before anything of them was kept, and counted
        # Memory: the flood's share of first chunks, nothing more (the legit message is complete).
        assert reassembler.buffered <= share * CHUNK
        assert set(flood_in.payloads()) == {PROBE}
