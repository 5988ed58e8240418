"""Training modes over the one role runtime (see :mod:`edgeagent.roles.mode` for the interface).

A mode is a package here, ``edgeagent.modes.<name>``: its :class:`~edgeagent.roles.mode.TrainingMode`
(the package's face), its central half and its worker half. A mode imports the nodes' shared code in
:mod:`edgeagent.roles`; the roles never import a mode: the CLI, above both, hands :func:`mode` to the
nodes (``Central(config, modes=mode)``, ``Worker(config, modes=mode)``).

:data:`MODES`, the registry (:mod:`edgeagent.mode_names`, one line per mode), names where each mode
lives; :func:`mode` imports it on first use. Importing a mode's package pulls in its whole data plane
(torch, the pipeline): so the registry itself imports nothing, and a command that only names the modes
(``--help``) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from edgeagent.errors import ConfigError
from edgeagent.mode_names import MODES

if TYPE_CHECKING:
    from edgeagent.roles.mode import TrainingMode

_loaded: dict[str, TrainingMode] = {}  # by where it lives ("module:class")


def mode(name: str) -> TrainingMode:
    """The training mode called ``name`` (one instance per process); a :class:`ConfigError` that lists
    the known modes if there is none of that name (the registry is read at every call: a test may
    register a mode, and take it away again)."""
    entry = MODES.get(name)
    if entry is None:
        raise ConfigError(f"unknown training mode {name!r}; known modes: {', '.join(sorted(MODES))}")
    found = _loaded.get(entry.where)
    if found is None:
        module, cls = entry.where.split(":")
        found = getattr(importlib.import_module(module), cls)()
        _loaded[entry.where] = found
    return found


__all__ = ["MODES", "mode"]
