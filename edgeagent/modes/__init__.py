"""Training modes over the one role runtime (see :mod:`edgeagent.modes.base` for the interface)."""
