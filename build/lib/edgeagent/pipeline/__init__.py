"""One pipeline stage (forward, backward, weight stashing) and the 1F1B schedule as data."""
