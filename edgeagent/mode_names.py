"""The training modes' names and the options that belong to one mode: declared here once.

Torch-free and import-free on purpose: the configuration (:mod:`edgeagent.config`), the command line's
``--mode`` choices and its per-mode option groups read these without loading any mode's code; the
registry (:data:`edgeagent.modes.MODES`) maps the same names to their implementations. It sits
beside the configuration, below the modes, so the configuration never imports up into the modes.
"""

from __future__ import annotations

from typing import Literal, get_args

# A new mode adds its name here and a line to edgeagent.modes.MODES (a unit test checks they agree).
ModeName = Literal["pipeline", "hybrid", "split-federated", "allreduce"]
MODE_NAMES: tuple[ModeName, ...] = get_args(ModeName)
DEFAULT_MODE: ModeName = "pipeline"

# The central node's keys that only some modes read, and those modes: a configuration that sets one of
# them (YAML or flag) under another mode is refused, rather than silently ignored.
MODE_KEYS: dict[str, tuple[ModeName, ...]] = {
    "max_replicas": ("hybrid",),
    "splitfed_plan": ("split-federated",),
    "split_point": ("split-federated",),
    "parallel_batches": ("split-federated",),
    "exhaustive_max_n": ("split-federated",),
    "exhaustive_iterations": ("split-federated",),
    "splitfed_similar": ("split-federated",),
    "splitfed_trial": ("split-federated",),
    "split": ("split-federated", "allreduce"),
    "collective": ("allreduce",),
    "allreduce_timeout": ("allreduce",),
    "allreduce_timeout_floor": ("allreduce",),
    "fail_links": ("allreduce",),
}


def applies_to(modes: tuple[str, ...]) -> str:
    """``"--mode allreduce only"``, ``"--mode split-federated and allreduce only"``: the marker of an
    option that only ``modes`` read (help texts and refusals)."""
    return f"--mode {' and '.join(modes)} only"


__all__ = ["DEFAULT_MODE", "MODE_KEYS", "MODE_NAMES", "ModeName", "applies_to"]
