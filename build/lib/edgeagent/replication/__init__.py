"""Weight snapshots and replicas (chain, global) and the switch to a new split."""
