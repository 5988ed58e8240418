"""Pure planning policy: layer profiles, capacity estimates and partitions. No I/O."""
