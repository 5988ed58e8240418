"""``edgeagent install-service``: a shipped unit rewritten for this install (pure text in, text out).

The shipped units (``edgeagent/share/systemd``) name the paths docs/deployment.md installs to:
``/opt/edgeagent/venv/bin/edgeagent``, ``/etc/edgeagent/...``, the documentation under that venv. A unit
for this machine replaces them by this install's program and documentation, the chosen configuration
directory (``--etc``: where ``edgeagent bundle`` unpacks) and configuration file, and the unit's name,
which is also its state directory: two services never share one (each dynamic user owns its own).
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from edgeagent.errors import ConfigError
from edgeagent.ops.shipped import SHARE, unit_file
from edgeagent.ops.units import INSTALLED_PROGRAM

INSTALLED_ETC = "/etc/edgeagent"
_DOCS = re.compile(r"^Documentation=.*$", re.MULTILINE)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@-]{0,200}$")


@dataclass(frozen=True)
class UnitPaths:
    """What differs between the shipped unit and this machine's."""

    program: Path
    etc: Path = Path(INSTALLED_ETC)
    config: Path | None = None  # default: the unit's own file name under ``etc``
    name: str = ""  # default: edgeagent-<role>
    docs: Path = SHARE / "systemd" / "README.md"


def this_program() -> Path:
    """The ``edgeagent`` of this install: next to this interpreter (a venv's ``bin``), else on PATH."""
    beside = Path(sys.executable).with_name("edgeagent")
    if beside.is_file():
        return beside.absolute()
    found = shutil.which("edgeagent")
    if found is None:
        raise ConfigError("cannot find this install's edgeagent program; give it with --program")
    return Path(found).absolute()


def render_unit(role: str, paths: UnitPaths) -> tuple[str, str]:
    """(unit name, unit text) of ``role`` for ``paths``."""
    text = unit_file(role).read_text(encoding="utf-8")
    name = paths.name or f"edgeagent-{role}"
    if name.endswith(".service"):
        name = name.removesuffix(".service")
    if not _NAME.match(name):
        raise ConfigError(f"unit name {name!r}: letters, digits and :_.@- only")
    for path, what in ((paths.program, "--program"), (paths.etc, "--etc")):
        if not path.is_absolute():
            raise ConfigError(f"{what} {path}: give an absolute path (systemd runs the unit from /)")
    if INSTALLED_PROGRAM not in text:
        raise ConfigError(f"{unit_file(role)} does not run {INSTALLED_PROGRAM}; cannot rewrite it")
    text = text.replace(INSTALLED_PROGRAM, shlex.quote(str(paths.program)))
    etc = str(paths.etc).rstrip("/") or "/"
    text = text.replace(f"{INSTALLED_ETC}/", f"{etc}/")
    if paths.config is not None:
        config = paths.config if paths.config.is_absolute() else Path.cwd() / paths.config
        shipped = re.search(r"--config (\S+)", text)
        if shipped is None:
            raise ConfigError(f"the {role} unit takes no --config")
        text = text.replace(f"--config {shipped.group(1)}", f"--config {shlex.quote(str(config))}")
    text = _DOCS.sub(f"Documentation=file://{paths.docs}", text)
    shipped_name = f"edgeagent-{role}"
    text = text.replace(f"StateDirectory={shipped_name}\n", f"StateDirectory={name}\n")
    text = text.replace(f"WorkingDirectory=%S/{shipped_name}\n", f"WorkingDirectory=%S/{name}\n")
    header = (
        f"# Written by `edgeagent install-service {role}` from {unit_file(role)}\n"
        f"# (rewritten for this install: program, configuration under {etc}, state directory {name}).\n"
    )
    return name, header + text


def write_unit(role: str, paths: UnitPaths, dest: Path) -> Path:
    """Write the unit to ``dest/<name>.service`` (mode 0644: systemd reads it as root; it holds no
    secret) and return its path."""
    name, text = render_unit(role, paths)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f"{name}.service"
    target.write_text(text, encoding="utf-8")
    target.chmod(0o644)
    return target


__all__ = ["INSTALLED_ETC", "UnitPaths", "render_unit", "this_program", "write_unit"]
