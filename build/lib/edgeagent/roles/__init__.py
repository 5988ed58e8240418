"""The processes of a cluster: the central node and the workers, over a shared role runtime."""
