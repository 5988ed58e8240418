"""Device profiles: ``configs/devices/<id>.yaml``, validated once on the central node, pushed as
retained messages on ``device/<id>/profile``, applied by the worker without a restart where it can.

A worker validates again (a profile may come from any tool that can publish) and, if it rejects one,
says why on its status topic and keeps its last good profile.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from edgeagent.config import build, load_yaml
from edgeagent.errors import ConfigError

# Settings a worker applies while it runs; changing any other one needs a restart.
LIVE = (
    "threads",
    "slowdown",
    "link_mbps",
    "heartbeat_interval",
    "metrics_interval",
    "memory_limit_mb",
    "compression",
)


class DeviceProfile(BaseModel):
    """Everything a worker can be told from the central node."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    role: str = Field("worker", pattern="^worker$")
    threads: int = Field(1, ge=1, le=256)
    slowdown: float = Field(1.0, ge=1.0, description="emulate a device this many times slower")
    link_mbps: float = Field(0.0, ge=0, description="emulated uplink; 0: the real link")
    heartbeat_interval: float = Field(1.0, gt=0, le=60)
    metrics_interval: float = Field(1.0, ge=0, le=600)
    memory_limit_mb: float = Field(0.0, ge=0)
    # How this device compresses the activations it sends: "run" follows the central node's choice;
    # "none", "2", "3", "4" override it (every payload names its codec, so receivers need nothing).
    # Replication intervals are not here: every stage must snapshot after the same batches.
    compression: Literal["run", "none", "2", "3", "4"] = "run"

    def digest(self) -> str:
        """A short hash of the settings (it appears in the worker's announcement)."""
        text = yaml.safe_dump(self.model_dump(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def needs_restart(self, previous: DeviceProfile | None) -> list[str]:
        """Keys whose change cannot be applied live."""
        if previous is None:
            return []
        now, before = self.model_dump(), previous.model_dump()
        return [k for k in now if k not in LIVE and now[k] != before[k]]


def parse_profile(data: Any, *, source: str) -> DeviceProfile:
    """Validate a profile; :class:`ConfigError` names the source, the key and what is allowed."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a profile must be a mapping, got {type(data).__name__}")
    return build(DeviceProfile, data, source=source)


def load_profile(path: str | Path) -> DeviceProfile:
    profile = parse_profile(load_yaml(path), source=str(path))
    if Path(path).stem != profile.id:
        raise ConfigError(f"{path}: id {profile.id!r} does not match the file name {Path(path).stem!r}")
    return profile


def load_profiles(directory: str | Path, ids: list[str] | None = None) -> list[DeviceProfile]:
    """All profiles of ``directory`` (or the named ones); every error is reported, not just the first."""
    paths = sorted(Path(directory).glob("*.yaml"))
    if ids:
        paths = [p for p in paths if p.stem in ids]
        missing = sorted(set(ids) - {p.stem for p in paths})
        if missing:
            raise ConfigError(f"no profile for {missing} in {directory}")
    profiles, errors = [], []
    for path in paths:
        try:
            profiles.append(load_profile(path))
        except ConfigError as exc:
            errors.append(str(exc))
    if errors:
        raise ConfigError("\n".join(errors))
    return profiles


def profile_message(profile: DeviceProfile) -> Any:
    from edgeagent.protocol.messages import Profile

    return Profile(device_id=profile.id, settings=profile.model_dump(), digest=profile.digest())


def push(transport: Any, topics: Any, profiles: list[DeviceProfile], *, sender: str = "central") -> None:
    """Publish each profile retained on its device's profile topic (a device that starts later gets it)."""
    from edgeagent.protocol.topics import Family
    from edgeagent.protocol.wire import encode

    for profile in profiles:
        transport.publish(
            topics.device(Family.PROFILE, profile.id),
            encode(profile_message(profile), sender=sender),
            retain=True,
        )


def fetch(transport: Any, topics: Any, device_id: str, *, timeout: float = 3.0) -> DeviceProfile | None:
    """The profile retained for ``device_id`` on the broker, or ``None``."""
    import threading

    from edgeagent.errors import ProtocolError
    from edgeagent.protocol.messages import Profile
    from edgeagent.protocol.topics import Family
    from edgeagent.protocol.wire import decode

    box: list[DeviceProfile] = []
    got = threading.Event()

    def on_message(topic: str, payload: bytes) -> None:
        try:
            _, msg = decode(payload)
            if isinstance(msg, Profile):
                box.append(parse_profile(msg.settings, source=f"retained profile of {device_id}"))
        except (ProtocolError, ConfigError):
            pass
        got.set()

    transport.subscribe(topics.device(Family.PROFILE, device_id), on_message)
    got.wait(timeout)
    return box[0] if box else None


def dump(profile: DeviceProfile) -> str:
    return yaml.safe_dump(profile.model_dump(), sort_keys=False)
