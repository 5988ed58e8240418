"""Device profiles: validation errors name the file and the key; the shipped profiles validate."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.errors import ConfigError
from edgeagent.ops.profiles import DeviceProfile, load_profile, load_profiles, parse_profile

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "devices"


def test_shipped_profiles_validate() -> None:
    profiles = load_profiles(CONFIGS)
    assert {p.id for p in profiles} >= {"worker-1", "worker-2"}


def test_a_typo_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "pi-1.yaml"
    path.write_text("id: pi-1\nslowdwn: 2\n")
    with pytest.raises(ConfigError, match=r"pi-1\.yaml.*unknown key 'slowdwn'"):
        load_profile(path)


def test_a_wrong_value_names_the_key_and_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"slowdown.*greater than or equal to 1"):
        parse_profile({"id": "pi-1", "slowdown": 0.5}, source="push")
    with pytest.raises(ConfigError, match=r"heartbeat_interval"):
        parse_profile({"id": "pi-1", "heartbeat_interval": "often"}, source="push")


def test_file_name_must_match_the_id(tmp_path: Path) -> None:
    path = tmp_path / "pi-2.yaml"
    path.write_text("id: pi-1\n")
    with pytest.raises(ConfigError, match="does not match the file name"):
        load_profile(path)


def test_digest_and_restart_keys() -> None:
    a = DeviceProfile(id="pi-1")
    b = DeviceProfile(id="pi-1", slowdown=2.0)
    assert a.digest() != b.digest() and len(a.digest()) == 12
    assert b.needs_restart(a) == []  # slowdown applies live
    assert DeviceProfile(id="pi-9").needs_restart(a) == ["id"]
