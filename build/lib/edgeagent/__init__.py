"""edgeagent: train one PyTorch model across several small edge devices as an asynchronous pipeline
over MQTT."""

from __future__ import annotations

__version__ = "0.1.0"
