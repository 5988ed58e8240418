"""The embedded broker's logins and topic rights (an amqtt plugin).

Every client must send a user name and the right password (argon2 hashes from a directory made by
``edgeagent credentials``). A client without a user name is refused: amqtt's own anonymous plugin
with ``allow_anonymous: false`` lets in anyone who sends *some* user name, so it is not used.

Topic rights come from :mod:`edgeagent.protocol.acl`, including those on Home Assistant's discovery topics
(outside ``edgeagent/``, under each login's discovery prefix). Stage ownership follows the run: the
plugin reads the assignments and re-partition orders the central node publishes on
``device/<id>/control`` and its ``reshare`` commands on ``run/command`` (only a central login may
publish on either), with every stage's group of devices, and keeps the newest plan per cluster in
``plans.json`` (in ``$STATE_DIRECTORY`` under systemd, else next to the credentials), so a restarted
broker still knows who holds which stage.

The credentials directory is re-read when its files change: ``edgeagent credentials add`` takes effect
for the next connection without a broker restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amqtt.contexts import Action, BaseContext
from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin
from amqtt.session import Session

from edgeagent.broker.credentials import PASSWD, USERS, CredentialStore, verify_password
from edgeagent.errors import EdgeAgentError, ProtocolError
from edgeagent.protocol.acl import Grant, PlanTracker, client_id_ok, may_publish, may_receive, may_subscribe
from edgeagent.protocol.chunking import Reassembler, is_chunk
from edgeagent.protocol.commands import Reshare
from edgeagent.protocol.messages import Assign, Repartition
from edgeagent.protocol.topics import Family, parse_topic
from edgeagent.protocol.wire import decode

log = logging.getLogger(__name__)
PLANS = "plans.json"
_MAX_DECISIONS = 65536


class SecurityPlugin(BaseAuthPlugin, BaseTopicPlugin):
    @dataclass
    class Config:
        credentials: str = ""
        # Where the stage owners are kept across broker restarts; default: plans.json in credentials.
        state_file: str = ""

    def __init__(self, context: BaseContext) -> None:
        super().__init__(context)
        config: Any = self.context.config
        if not config.credentials:
            raise EdgeAgentError("the security plugin needs `credentials`: a directory made by edgeagent")
        self.store = CredentialStore(config.credentials)
        self._stamp: tuple[float, ...] = ()
        self.users: dict[str, Any] = {}
        self.grants: dict[str, Grant] = {}
        self._reload()
        if not self.users:
            raise EdgeAgentError(
                f"no logins in {self.store.directory}: add some with `edgeagent credentials add`"
            )
        # systemd's StateDirectory= if there is one: the credentials may be a read-only copy there.
        state_dir = os.environ.get("STATE_DIRECTORY", "").split(":")[0] or self.store.directory
        self.state_file = Path(config.state_file or Path(state_dir) / PLANS)
        self.plans = PlanTracker()
        if self.state_file.exists():
            try:
                self.plans = PlanTracker.from_json(self.state_file.read_text(encoding="utf-8"))
            except (ValueError, TypeError) as exc:
                log.warning("ignoring the stage owners in %s (%s); they are relearned", self.state_file, exc)
        # Decisions per (user, topic, action): the same few topics carry every batch. Cleared whenever
        # the logins or the plans change.
        self._decisions: dict[tuple[str, str, Any], bool] = {}
        self._reassembler = Reassembler(max_message=256 * 1024 * 1024, max_pending=16)
        self.refused = 0

    # -- logins --------------------------------------------------------------------------------

    def _reload(self) -> None:
        files = [self.store.directory / USERS, self.store.directory / PASSWD]
        stamp = tuple(f.stat().st_mtime if f.exists() else 0.0 for f in files)
        if stamp == self._stamp:
            return
        try:
            users = self.store.users()
        except EdgeAgentError as exc:  # keep the last good logins
            log.error("cannot reload the logins (%s); keeping the previous ones", exc)
            return
        self._decisions = {}
        self.users = {n: u.argon2 for n, u in users.items()}
        self.grants = {n: u.grant for n, u in users.items()}
        self._stamp = stamp

    async def authenticate(self, *, session: Session) -> bool:
        self._reload()
        name = session.username
        if not name:
            return self._refuse(session, "sent no user name (anonymous clients are not allowed here)")
        hashed = self.users.get(name)
        # argon2 takes tens of milliseconds: verify off the event loop, so bad logins cannot stall it.
        loop = asyncio.get_running_loop()
        if hashed is None or not await loop.run_in_executor(
            None, verify_password, session.password or "", hashed
        ):
            return self._refuse(session, f"user {name!r}: wrong user name or password")
        grant = self.grants[name]
        if not client_id_ok(name, grant, session.client_id or "", self.grants):
            return self._refuse(session, f"user {name!r} may not use client id {session.client_id!r}")
        # amqtt sends wills without asking the topic plugins, so the will is checked here.
        if session.will_flag and not may_publish(name, grant, session.will_topic or "", self.plans):
            return self._refuse(session, f"user {name!r} may not leave a will on {session.will_topic!r}")
        return True

    def _refuse(self, session: Session, why: str) -> bool:
        self.refused += 1
        log.warning("refused client %r: %s", session.client_id, why)
        return False

    # -- topics --------------------------------------------------------------------------------

    async def topic_filtering(
        self, *, session: Session | None = None, topic: str | None = None, action: Action | None = None
    ) -> bool:
        name = session.username if session else None
        grant = self.grants.get(name or "")
        if name is None or grant is None or not topic:
            return False
        key = (name, topic, action)
        cached = self._decisions.get(key)
        if cached is not None:
            return cached
        if action == Action.PUBLISH:
            allowed = may_publish(name, grant, topic, self.plans)
            if not allowed:
                log.warning("refused %s publishing to %s (not its topic)", name, topic)
        elif action == Action.SUBSCRIBE:
            allowed = may_subscribe(name, grant, topic)
            if not allowed:
                log.warning("refused %s subscribing to %s", name, topic)
        else:
            allowed = may_receive(name, grant, topic)
        if len(self._decisions) >= _MAX_DECISIONS:  # bounded: a client inventing topics cannot grow it
            self._decisions.clear()
        self._decisions[key] = allowed
        return allowed

    async def on_broker_message_broadcast(self, *, client_id: str, message: Any) -> None:
        """Learn stage owners from the central node's assignments, re-partitions and reshares (only a
        central login can publish on control topics and on the command topic, and this event fires only
        for permitted messages)."""
        topic = str(message.topic)
        try:
            cluster, info = parse_topic(topic)
        except ProtocolError:
            return
        if info.family not in (Family.CONTROL, Family.COMMAND):
            return
        payload = bytes(message.data or b"")
        with contextlib.suppress(Exception):
            if is_chunk(payload):
                whole = self._reassembler.feed(topic, payload)
                if whole is None:
                    return
                payload = whole
            _, order = decode(payload)
            if info.family is Family.CONTROL and isinstance(order, Assign | Repartition):
                version = order.share_version if isinstance(order, Assign) else 0  # a new plan: shares 0
            elif info.family is Family.COMMAND and isinstance(order, Reshare):
                version = order.share_version
            else:
                return
            if self.plans.update(
                cluster,
                order.run_id,
                order.plan_id,
                list(order.worker_list),
                groups=order.groups,
                share_version=version,
            ):
                self._decisions.clear()
                log.info(
                    "cluster %s plan %d (shares %d): stages held by %s",
                    cluster,
                    order.plan_id,
                    version,
                    order.groups or order.worker_list,
                )
                self._save_plans()

    def _save_plans(self) -> None:
        try:
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(self.plans.to_json(), encoding="utf-8")
            os.replace(tmp, self.state_file)
        except OSError as exc:
            log.warning(
                "cannot keep the stage owners in %s (%s); a broker restart forgets them", self.state_file, exc
            )
