"""The worker's commands about the device itself, whatever run it is in: its ``h`` asked for by a
``Discover`` or a ``characterise`` command (:mod:`.characterise`), an emulated slowdown (``emulate``), and
its device profile applied live (operations: ``edgeagent profile``; the last good one is kept when a new
one is invalid). The settings they change stay on the worker, where the sessions read them."""

from __future__ import annotations

import logging
from typing import Any, Literal, Protocol

from edgeagent.config import WorkerConfig
from edgeagent.errors import ConfigError
from edgeagent.ops.profiles import DeviceProfile, parse_profile
from edgeagent.predictor.measure import Characterisation
from edgeagent.protocol.commands import Characterise, Emulate
from edgeagent.protocol.messages import Discover, ErrorCode, Profile, StatusState
from edgeagent.roles.mode import WorkerSession
from edgeagent.roles.worker.characterise import Characteriser
from edgeagent.runtime.compute import configure_threads
from edgeagent.runtime.intake import Inbound
from edgeagent.runtime.pulse import Pulse
from edgeagent.transport.base import Transport

log = logging.getLogger("edgeagent.roles.worker.node")


class DeviceOwner(Protocol):
    """The worker as its device commands see it: the device's live settings (read by the sessions) and
    how it speaks (announcement, status, error reports)."""

    device_id: str
    config: WorkerConfig
    transport: Transport
    pulse: Pulse
    characteriser: Characteriser
    session: WorkerSession | None
    left_run: str  # the run this device went on without it (left out of its plan), "" if none
    slowdown: float
    link_mbps: float
    memory_limit_mb: float
    profile: DeviceProfile | None

    def announce(self, h: Characterisation | Literal["latest"] | None = "latest") -> None: ...

    def report_error(self, code: ErrorCode, reason: str, run_id: str = "", *, about: str = "") -> None: ...

    def set_status(
        self, state: StatusState, *, run_id: str = "", stage: int = -1, detail: str = ""
    ) -> None: ...


class DeviceCommands:
    """The handlers of the commands about the device (see the module doc), the worker's own."""

    def __init__(self, owner: DeviceOwner) -> None:
        self.owner = owner

    def on_emulate(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Emulate)
        w = self.owner
        run = w.session.run_id if w.session is not None else w.left_run  # a device left out may be asked back
        if not msg.run_id or msg.run_id != run:
            return  # commands belong to a run: another run's (or a forged one's) are not ours
        if msg.device == w.device_id:
            log.info("%s: slowdown %.1f -> %.1f", w.device_id, w.slowdown, msg.slowdown)
            w.slowdown = msg.slowdown

    # -- h ---------------------------------------------------------------------------------------

    def on_discover(self, item: Inbound) -> None:
        """Announce; with the model named, with its ``h``, measured first unless known. A device busy
        with another run does not measure (it would slow that run down): it says what it knows."""
        msg = item.message
        assert isinstance(msg, Discover)
        w = self.owner
        if not msg.model:
            w.announce()
        elif w.session is not None and w.session.run_id != msg.run_id:
            w.announce(w.characteriser.lookup(msg.model, msg.batch_size, w.slowdown))
        else:
            try:
                w.announce(self._characterise(msg.model, msg.batch_size, fresh=False))
            except ConfigError:  # logged by the characteriser; the announcement goes without h
                w.announce(None)

    def on_characterise(self, item: Inbound) -> None:
        """Measure ``h`` again (the cache bypassed) and announce it; the node's own command, so also
        during a run (which waits meanwhile)."""
        msg = item.message
        assert isinstance(msg, Characterise)
        w = self.owner
        if msg.device != w.device_id:
            return
        if w.session is not None and msg.run_id != w.session.run_id:
            reason = f"not measuring h for run {msg.run_id}: training run {w.session.run_id}"
            w.report_error("busy", reason, msg.run_id)
            return
        try:
            w.announce(self._characterise(msg.model, msg.batch_size, fresh=True))
        except ConfigError as exc:  # logged by the characteriser
            w.report_error("command", str(exc), msg.run_id)
            w.announce(None)

    def _characterise(self, model: dict[str, Any], batch_size: int, *, fresh: bool) -> Characterisation:
        """``h`` for ``model`` at the current slowdown, measured with this device's torch threads; a
        :class:`ConfigError` for a model this worker may not build (``allowed_models``)."""
        w = self.owner
        refusal = w.config.model_refusal(model.get("name"))
        if refusal is not None:
            log.error("%s: not measuring h: %s", w.device_id, refusal)
            raise ConfigError(refusal)
        threads = w.profile.threads if w.profile else w.config.threads
        return w.characteriser.measure(model, batch_size, slowdown=w.slowdown, threads=threads, fresh=fresh)

    # -- device profiles (operations) ---------------------------------------------------------

    def on_profile(self, item: Inbound) -> None:
        """Apply what can change live; keep the last good profile if this one is invalid."""
        msg = item.message
        assert isinstance(msg, Profile)
        w = self.owner
        try:
            profile = parse_profile(msg.settings, source=f"profile {msg.digest or '?'} for {w.device_id}")
            if profile.id != w.device_id:
                raise ConfigError(f"profile for {profile.id!r} sent to {w.device_id!r}")
        except ConfigError as exc:
            log.error(
                "%s rejected a profile, keeping %s: %s",
                w.device_id,
                w.profile.digest() if w.profile else "its start-up settings",
                exc,
            )
            w.report_error("profile", str(exc))
            self._restate(f"profile rejected: {exc}")
            return
        restart = profile.needs_restart(w.profile)
        configure_threads(profile.threads)
        w.slowdown = profile.slowdown
        w.link_mbps = profile.link_mbps
        set_link = getattr(w.transport, "set_link_mbps", None)
        if set_link is not None:
            set_link(profile.link_mbps)
        w.pulse.set_heartbeat_interval(profile.heartbeat_interval)
        w.pulse.set_metrics_interval(profile.metrics_interval)
        w.memory_limit_mb = profile.memory_limit_mb
        w.profile = profile
        if w.session is not None:
            w.session.profile_changed()
        detail = f"profile {profile.digest()} applied"
        if restart:
            detail += f"; restart to apply {restart}"
        log.info("%s: %s", w.device_id, detail)
        self._restate(detail)
        if w.session is None:
            w.announce()  # the birth message carries the profile's hash

    def _restate(self, detail: str) -> None:
        """Publish the current status again with ``detail`` (what became of a profile)."""
        w = self.owner
        state: StatusState = "training" if w.session else "idle"
        status = w.pulse.status
        w.set_status(state, run_id=status.run_id, stage=status.stage, detail=detail)


__all__ = ["DeviceCommands", "DeviceOwner"]
