"""The command line: ``edgeagent central|worker|demo|broker|monitor|profile|credentials|certs``."""

from edgeagent.cli.main import main

__all__ = ["main"]
