"""What the package ships besides code: example configurations and systemd units (``edgeagent/share/``).

A wheel installs them next to the code, so every command finds them without a checkout: ``--config
demo.yaml`` (or ``configs/demo.yaml``) falls back to the shipped file when there is no such file here,
``edgeagent demo`` without ``--config`` runs the shipped ``demo.yaml``, and ``edgeagent install-service``
starts from the shipped unit. The repository's top-level ``configs/`` and ``systemd/`` are links to these
folders. Pure path arithmetic: nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path

SHARE = Path(__file__).resolve().parents[1] / "share"
CONFIGS = SHARE / "configs"
UNITS = SHARE / "systemd"
ROLES = ("broker", "central", "worker")


def unit_file(role: str) -> Path:
    """The shipped unit of ``role`` (``edgeagent-<role>.service``)."""
    if role not in ROLES:
        raise ValueError(f"no unit for role {role!r}; roles: {', '.join(ROLES)}")
    return UNITS / f"edgeagent-{role}.service"


def config_file(given: str | Path) -> Path:
    """``given`` if that file exists; else the shipped configuration of that name (``demo.yaml``,
    ``configs/demo.yaml``, ``devices/worker-1.yaml``); else ``given`` unchanged, for the caller's own
    "no such file" error."""
    path = Path(given)
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts[:1] == ("configs",) else path.parts
    shipped = CONFIGS.joinpath(*parts) if parts else CONFIGS
    return shipped if shipped.is_file() else path


__all__ = ["CONFIGS", "ROLES", "SHARE", "UNITS", "config_file", "unit_file"]
