"""The shipped systemd units (``edgeagent/share/systemd/*.service``) read as systemd reads them: pure, no
I/O beyond the file.

The tests and the chaos benchmark run a role with its unit's exact ``ExecStart`` (and restart it as
``Restart=`` would), on a machine without the installed paths: :meth:`ServiceUnit.command` expands the
specifiers the units use and puts this machine's program, configuration and state directory in place of
the installed ones, and nothing else.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

INSTALLED_PROGRAM = "/opt/edgeagent/venv/bin/edgeagent"
"""What the units run (docs/deployment.md installs edgeagent there)."""


@dataclass(frozen=True)
class ServiceUnit:
    """A unit file's sections as ``{section: {key: [values, in order]}}``."""

    path: Path
    sections: dict[str, dict[str, list[str]]]

    @classmethod
    def read(cls, path: str | Path) -> ServiceUnit:
        """Parse ``path``: a line ending in a backslash goes on on the next one (its newline becomes a
        space), ``#`` and ``;`` lines are comments, a key may repeat (``LoadCredential=``)."""
        path = Path(path)
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        sections: dict[str, dict[str, list[str]]] = {}
        current = sections.setdefault("", {})
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                current = sections.setdefault(line[1:-1], {})
                continue
            key, sep, value = line.partition("=")
            if sep:
                current.setdefault(key.strip(), []).append(value.strip())
        return cls(path, sections)

    def value(self, key: str, default: str = "", *, section: str = "Service") -> str:
        """The last value of ``key`` (what systemd takes for a single-valued key)."""
        values = self.sections.get(section, {}).get(key)
        return values[-1] if values else default

    @property
    def settings(self) -> dict[str, str]:
        """The ``[Service]`` keys, the last value of each."""
        return {key: values[-1] for key, values in self.sections.get("Service", {}).items() if values}

    def credentials(self) -> list[tuple[str, str]]:
        """``LoadCredential=NAME:PATH`` lines as (name, path): what systemd copies into
        ``$CREDENTIALS_DIRECTORY/NAME`` before the start."""
        pairs = []
        for entry in self.sections.get("Service", {}).get("LoadCredential", []):
            name, _, source = entry.partition(":")
            pairs.append((name, source))
        return pairs

    def environment(self) -> dict[str, str]:
        """``Environment=`` assignments (``KEY=VALUE``, several to a line, shell-quoted), later ones win."""
        env: dict[str, str] = {}
        for line in self.sections.get("Service", {}).get("Environment", []):
            for word in shlex.split(line):
                key, sep, value = word.partition("=")
                if sep:
                    env[key] = value
        return env

    def command(
        self,
        *,
        program: str | Path,
        state: str | Path,
        credentials: str | Path,
        files: Mapping[str, str | Path] | None = None,
    ) -> list[str]:
        """``ExecStart`` as argv, with ``${STATE_DIRECTORY}`` and ``${CREDENTIALS_DIRECTORY}`` expanded,
        the installed program replaced by ``program`` and every argument that equals a key of ``files``
        (an installed path such as ``/etc/edgeagent/central.yaml``) by its value. Raises ValueError if the
        unit runs something else or a path of ``files`` is not in its command: then the caller would not
        be running the unit's command."""
        line = self.value("ExecStart").replace("${STATE_DIRECTORY}", str(state))
        line = line.replace("${CREDENTIALS_DIRECTORY}", str(credentials))
        argv = shlex.split(line)
        if not argv or argv[0] != INSTALLED_PROGRAM:
            raise ValueError(f"{self.path}: ExecStart runs {argv[:1]}, not {INSTALLED_PROGRAM}")
        replace = {k: str(v) for k, v in (files or {}).items()}
        missing = [k for k in replace if k not in argv]
        if missing:
            raise ValueError(f"{self.path}: ExecStart has no argument {missing[0]}: {line}")
        return [str(program), *(replace.get(a, a) for a in argv[1:])]

    def working_directory(self, state: str | Path) -> Path:
        """``WorkingDirectory=`` with ``%S/<StateDirectory=>`` (the state directory) as ``state``; ``/`` if
        unset."""
        own = f"%S/{self.value('StateDirectory')}"
        return Path(self.value("WorkingDirectory", "/").replace(own, str(state)))

    @property
    def restart_sec(self) -> float:
        """``RestartSec=`` in seconds (plain seconds or ms, as the shipped units write it; default 0.1)."""
        text = self.value("RestartSec", "100ms")
        return float(text[:-2]) / 1000 if text.endswith("ms") else float(text.removesuffix("s"))


__all__ = ["INSTALLED_PROGRAM", "ServiceUnit"]
