from ovpool.cli import entry

entry()
