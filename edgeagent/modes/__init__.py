"""Training modes over the one role runtime (see :mod:`edgeagent.roles.mode` for the interface).

A mode is a package here, ``edgeagent.modes.<name>``: its :class:`~edgeagent.roles.mode.TrainingMode`
(the package's face), its central half and its worker half. A mode imports the nodes' shared code in
:mod:`edgeagent.roles`; the roles never import a mode: the CLI, above both, hands :func:`mode` to the
nodes (``Central(config, modes=mode)``, ``Worker(config, modes=mode)``).

:data:`MODES` names where each mode lives; :func:`mode` imports it on first use. Importing a mode's
package pulls in its whole data plane (torch, the pipeline): so the registry itself imports nothing, and
a command that only names the modes (``--help``) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from edgeagent.errors import ConfigError

if TYPE_CHECKING:
    from edgeagent.roles.mode import TrainingMode

# name (``--mode``, ``Assign.mode``) -> "module:class" of its TrainingMode. A new mode adds a line here.
MODES: dict[str, str] = {
    "pipeline": "edgeagent.modes.pipeline:PipelineMode",
    "hybrid": "edgeagent.modes.pipeline.hybrid:HybridMode",
    "split-federated": "edgeagent.modes.splitfed:SplitFedMode",
    "allreduce": "edgeagent.modes.allreduce:AllreduceMode",
}

_loaded: dict[str, TrainingMode] = {}


def mode(name: str) -> TrainingMode:
    """The training mode called ``name`` (one instance per process); a :class:`ConfigError` that lists
    the known modes if there is none of that name."""
    found = _loaded.get(name)
    if found is not None:
        return found
    where = MODES.get(name)
    if where is None:
        raise ConfigError(f"unknown training mode {name!r}; known modes: {', '.join(sorted(MODES))}")
    module, cls = where.split(":")
    found = getattr(importlib.import_module(module), cls)()
    _loaded[name] = found
    return found


__all__ = ["MODES", "mode"]
