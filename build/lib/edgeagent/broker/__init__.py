"""The embedded MQTT broker (amqtt) with per-device logins and topic rights, credentials and certificates."""

from edgeagent.broker.embedded import BrokerTls, EmbeddedBroker, broker_config, free_port, serve_forever

__all__ = ["BrokerTls", "EmbeddedBroker", "broker_config", "free_port", "serve_forever"]
