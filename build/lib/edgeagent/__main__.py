from edgeagent.cli.main import entry

entry()
