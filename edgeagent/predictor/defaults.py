"""The predictor's named choices and defaults that ``edgeagent predictor ... --help`` shows.

A module of its own, without torch, so the help of every command reads in a fraction of a second on a
Pi (the command's body imports :mod:`.net` and :mod:`.collect`, which re-export these names).
"""

from __future__ import annotations

from typing import Literal

Variant = Literal["paper", "features"]
VARIANTS: tuple[Variant, ...] = ("paper", "features")
STEPS: dict[Variant, int] = {"paper": 3000, "features": 8000}  # pre-training steps

# Every sub-model is timed in ROUNDS windows of at least collect.WINDOW s, interleaved over the collection
# (measure_rounds), and its time is the fastest of them (best_window): under a CPU quota one 0.2 s window
# repeated within 10 % for 50-60 % of sub-models here, the fastest of two interleaved windows for 78-93 %.
ROUNDS = 4

__all__ = ["ROUNDS", "STEPS", "VARIANTS", "Variant"]
