"""The few exceptions edgeagent raises. Messages carry the numbers that explain them."""

from __future__ import annotations


class EdgeAgentError(Exception):
    """Base class of every edgeagent error."""


class ProtocolError(EdgeAgentError):
    """A payload from the network could not be decoded or does not fit the protocol.

    Roles log these and drop the message; they never stop a role.
    """


class ConfigError(EdgeAgentError):
    """A configuration file, profile or command-line value is invalid.

    The message names the file (when there is one), the key and the allowed values.
    """


class TrainingError(EdgeAgentError):
    """Training cannot go on (for example no worker answered within the start-up timeout)."""


class DivergedError(TrainingError):
    """The training loss is not finite, or stayed above chance's (``pipeline.divergence``): the message
    gives the batch or epoch, the figures and what to change."""


class StorageError(EdgeAgentError):
    """A file a run writes (a checkpoint, the report, the model) could not be written: a full disk, a
    quota, a missing directory. The message names the path, the bytes wanted and the free space; the
    previous file is left as it was (:func:`edgeagent.ops.files.write_atomic`)."""


class PlanningError(EdgeAgentError):
    """No split of the model fits the devices (too few layers, or memory limits no split can meet).

    The message says how many layers, devices and megabytes were involved and what to change.
    """
