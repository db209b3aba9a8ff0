"""Shared fixtures. The EventStoreDB fixtures start the wire emulator on a free loopback port,
or use the real server named by ``TERRET_ESDB_URI``."""

import signal

pytest_plugins = ["tests.support.esdb_fixtures"]

# A suite started in the background by a shell without job control inherits SIGINT ignored,
# and so would every process it spawns: the Ctrl-C tests' processes would never see their
# SIGINT. Python's own handler here makes exec give the children the default disposition.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
