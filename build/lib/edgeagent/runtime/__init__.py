"""The role runtime: what every role (central node, worker) and every training mode runs on."""
