"""Moving bytes: the MQTT client (with link emulation), an in-memory twin, broker access."""
