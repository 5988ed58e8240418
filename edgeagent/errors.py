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


class PlanningError(EdgeAgentError):
    """No split of the model fits the devices (too few layers, or memory limits no split can meet).

    The message says how many layers, devices and megabytes were involved and what to change.
    """
