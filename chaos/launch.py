"""``python -m chaos.launch --synced-table PATH MODULE [ARGS...]``: run ``MODULE.main(ARGS)`` (a
server process, e.g. ``broker.server.broker_server -c FILE``) with the synced-size hook of ``chaos.unsynced``
installed, so that a crash fault can later cut its files back to what it had fsynced.

Only chaos runs start brokers this way; nothing in the broker knows about it. The config path
stays on the command line, so ``dledger.apps.cluster.is_running`` recognises the process.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from chaos.unsynced import SyncedSizeTable, install_hook

ALLOWED_MODULES = ("broker.server.broker_server", "dledger.apps.node_server")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.launch")
    parser.add_argument("--synced-table", required=True, help="the table file of this process")
    parser.add_argument("module", choices=ALLOWED_MODULES)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    install_hook(SyncedSizeTable(ns.synced_table))
    main_fn = importlib.import_module(ns.module).main
    return int(main_fn(ns.args) or 0)


if __name__ == "__main__":
    sys.exit(main())
