"""Benchmarks: scripts that print our figures beside the papers'."""
