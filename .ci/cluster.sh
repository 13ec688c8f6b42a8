#!/usr/bin/env bash
# The README's main command: set everything up (first run only), then drive the local cluster.
#
#   bash .ci/cluster.sh up --dir ./run      # start a 3-node dledger group on 127.0.0.1
#   bash .ci/cluster.sh status --dir ./run  # roles, terms, commit indexes (--json for machines)
#   bash .ci/cluster.sh down --dir ./run    # stop exactly the processes it started
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/.ci/setup.sh" >&2
exec "$REPO/.venv/bin/dledger-cluster" "$@"
