"""amqtt's relay of one published message to its subscribers, without its per-message debug formatting.

amqtt 0.12's ``Broker._run_broadcast`` builds its debug lines with f-strings whether or not debug logging
is on; the first formats the whole broadcast dict, the payload's bytes included: a 16 kB activation
became a 50 kB ``repr`` on every relay, a 260 kB MobileNetV2 activation 0.8 MB. A profile of the demo's
broker process (``py-spy --gil``) found 36 % of its interpreter time on that one line. :func:`run_broadcast`
is the same loop with each debug line built only when debug logging is on; what it does with a message
(which subscriptions match, the topic rights on receive, retaining for an offline persistent session,
the publish task per target) is amqtt's, line for line.

Only for the amqtt versions whose loop this copies (:data:`COPIED_FROM`); any other keeps amqtt's own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

COPIED_FROM = ("0.12.",)  # amqtt versions whose Broker._run_broadcast this is a copy of


def applies(version: str) -> bool:
    """Whether :func:`run_broadcast` is a copy of this amqtt version's loop."""
    return version.startswith(COPIED_FROM)


async def run_broadcast(broker: Any, running_tasks: Any) -> None:
    """One message off amqtt's broadcast queue, relayed to each subscriber it may go to
    (``Broker._run_broadcast`` of amqtt 0.12, debug lines built only when they are logged)."""
    from amqtt.contexts import Action
    from amqtt.mqtt.constants import QOS_1, QOS_2
    from amqtt.utils import format_client_message

    broadcast = await broker._broadcast_queue.get()
    logger = broker.logger
    debug = logger.isEnabledFor(logging.DEBUG)
    topic = broadcast["topic"]
    if debug:
        logger.debug(
            "Processing broadcast message on topic %r (%d bytes)", topic, len(broadcast["data"] or b"")
        )

    for k_filter, subscriptions in broker._subscriptions.items():
        if not broker._matches(topic, k_filter):
            continue
        for target_session, sub_qos in subscriptions:
            qos = broadcast.get("qos", sub_qos)
            sendable = await broker._topic_filtering(target_session, topic=topic, action=Action.RECEIVE)
            if not sendable:
                logger.info(
                    "%s not allowed to receive messages from TOPIC %s.", target_session.client_id, topic
                )
                continue
            # Retained for a persistent session that is not connected, at QoS 1 or 2 [MQTT 3.1.2.4], unless
            # it logged in anonymously (as amqtt).
            connected = target_session.transitions.state == "connected"
            if (
                not connected
                and not target_session.clean_session
                and qos in (QOS_1, QOS_2)
                and not target_session.is_anonymous
            ):
                await broker._retain_broadcast_message(broadcast, qos, target_session)
                continue
            if not connected:
                continue
            if debug:
                logger.debug(
                    "Broadcasting message from %s on topic '%s' to %s",
                    format_client_message(session=broadcast["session"]),
                    topic,
                    format_client_message(session=target_session),
                )
            handler = broker._get_handler(target_session)
            if handler:
                task = asyncio.ensure_future(
                    handler.mqtt_publish(topic, broadcast["data"], qos, retain=False)
                )
                running_tasks.append(task)
