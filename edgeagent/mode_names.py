"""The training modes' registry: one line per mode, every name and per-mode fact the lower layers need.

Torch-free and import-free on purpose: the configuration (:mod:`edgeagent.config`: ``mode`` and the keys
only some modes read), the command line (``--mode``'s choices and help, its per-mode option groups), the
wire codec (:mod:`edgeagent.protocol.wire`: a mode's message types), the report's plots and the modes'
own lookup (:func:`edgeagent.modes.mode`, which routes a worker's ``Assign`` by ``Assign.mode``) all
read :data:`MODES` without loading any mode's code: a mode is named by where it lives, as strings, and
imported where it is first used. It sits beside the configuration, below the protocol and the modes, so
neither the configuration nor the protocol ever imports up into a mode.

A new mode is a package ``edgeagent/modes/<name>/`` (its :class:`~edgeagent.roles.mode.TrainingMode`,
central half, worker half, messages and plot) and one :class:`ModeEntry` line in :data:`MODES`.
"""

from __future__ import annotations

from typing import NamedTuple


class ModeEntry(NamedTuple):
    """One training mode, as the layers below it need to know it.

    ``where`` is ``"module:class"`` of its TrainingMode; ``summary`` its few words in ``--mode``'s help;
    ``messages`` the module that declares its wire messages (``MESSAGES``, a tuple of message classes), if
    it has any of its own; ``plot`` ``"module:function"`` of its report's own figure
    (``(report, json_path) -> Path | None``), if any; ``keys`` the central node's configuration keys only
    it (and the other modes that list them) reads; ``stale``: its gradients may be computed on older
    weights (asynchronous pipelining), which the configuration's pipelined learning rate is for.
    """

    name: str
    where: str
    summary: str
    messages: str | None = None
    plot: str | None = None
    keys: tuple[str, ...] = ()
    stale: bool = False


_SPLITFED_KEYS = (
    "splitfed_plan",
    "split_point",
    "parallel_batches",
    "exhaustive_max_n",
    "exhaustive_iterations",
    "splitfed_similar",
    "splitfed_trial",
    "splitfed_server_threads",
    "split",
)
_ALLREDUCE_KEYS = ("split", "collective", "allreduce_timeout", "allreduce_timeout_floor", "fail_links")

# name (``--mode``, ``Assign.mode``) -> its entry, in ``--mode``'s order. A new mode adds a line here.
MODES: dict[str, ModeEntry] = {
    e.name: e
    for e in (
        ModeEntry(
            "pipeline",
            "edgeagent.modes.pipeline:PipelineMode",
            "FTPipeHD's asynchronous pipeline",
            stale=True,
        ),
        ModeEntry(
            "hybrid",
            "edgeagent.modes.pipeline.hybrid:HybridMode",
            "a stage may be held by several devices",
            keys=("max_replicas", "replicate_first"),
            stale=True,
        ),
        ModeEntry(
            "split-federated",
            "edgeagent.modes.splitfed:SplitFedMode",
            "PiPar: the data stays on the devices",
            messages="edgeagent.modes.splitfed.messages",
            plot="edgeagent.modes.splitfed.plot:plot_splitfed",
            keys=_SPLITFED_KEYS,
        ),
        ModeEntry(
            "allreduce",
            "edgeagent.modes.allreduce:AllreduceMode",
            "data-parallel, gradients averaged by --collective",
            messages="edgeagent.modes.allreduce.messages",
            plot="edgeagent.modes.allreduce.plot:plot_allreduce",
            keys=_ALLREDUCE_KEYS,
        ),
    )
}
DEFAULT_MODE = "pipeline"


def mode_names() -> tuple[str, ...]:
    """The registered modes' names, in ``--mode``'s order (read when needed: a test may register one)."""
    return tuple(MODES)


def mode_keys() -> dict[str, tuple[str, ...]]:
    """The central node's keys that only some modes read, and those modes (in registry order): a
    configuration that sets one of them (YAML or flag) under another mode is refused, rather than
    silently ignored."""
    keys: dict[str, tuple[str, ...]] = {}
    for entry in MODES.values():
        for key in entry.keys:
            keys[key] = (*keys.get(key, ()), entry.name)
    return keys


def modes_help() -> str:
    """``--mode``'s help: every mode and its summary (``"pipeline (FTPipeHD's ...); hybrid (...)"``)."""
    return "; ".join(f"{e.name} ({e.summary})" for e in MODES.values()) + "."


def applies_to(modes: tuple[str, ...]) -> str:
    """``"--mode allreduce only"``, ``"--mode split-federated and allreduce only"``: the marker of an
    option that only ``modes`` read (help texts and refusals)."""
    return f"--mode {' and '.join(modes)} only"


__all__ = [
    "DEFAULT_MODE",
    "MODES",
    "ModeEntry",
    "applies_to",
    "mode_keys",
    "mode_names",
    "modes_help",
]
