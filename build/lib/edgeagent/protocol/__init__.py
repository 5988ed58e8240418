"""Typed messages, topics, the wire format, receiver limits and topic rights."""
