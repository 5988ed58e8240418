"""The fifth mode's one message, with its own kind (the wire codec learns it from the registry entry)."""

from __future__ import annotations

import dataclasses

from edgeagent.protocol.messages import Kind, Message


class FifthKind(Kind):
    HELLO = "fifth_hello"


@dataclasses.dataclass(frozen=True)
class Hello(Message):
    """Central -> device: a greeting within run ``run_id``."""

    KIND = FifthKind.HELLO
    ENCODING = "json"
    run_id: str
    text: str
    count: int = 0


MESSAGES: tuple[type[Message], ...] = (Hello,)
