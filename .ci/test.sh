#!/usr/bin/env bash
# The project's test command (README): setup, lint, type-check, then every test tier.
#
#   bash .ci/test.sh                  # everything: fast tier, slow tier (clusters, chaos, Spark), compose drill
#   bash .ci/test.sh -m "not slow"    # fast tier only; any extra arguments go to pytest
#
# Runs all three checks even when one fails, so one run reports everything; exits non-zero if
# any failed. pytest's exit code 5 (no tests collected) is a failure too.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

bash "$REPO/.ci/setup.sh"

VENV_BIN="$REPO/.venv/bin"
# Tests find toxiproxy-server on PATH; the venv's tools come first.
export PATH="$VENV_BIN:$REPO/.ci/bin:$PATH"
export PYTHONDONTWRITEBYTECODE=1

# Test clusters refuse writes (DISK_FULL) at diskSpaceWarningLevelRatio, 90 % of df's Use%: say up
# front how full the disks the run writes to are.
"$VENV_BIN/python" - "$REPO" "${TMPDIR:-/tmp}" <<'EOF'
import sys

from dledger.durable import disk_used_ratio

for path in sys.argv[1:]:
    used = disk_used_ratio(path)
    warn = "  WARNING: test clusters refuse writes at 90 %" if used >= 0.85 else ""
    print(f"disk use of {path}: {used * 100:.1f} % (df's Use%){warn}")
EOF

failed=()
step() { # step NAME COMMAND...: run one check, remember a failure, keep going
    local name="$1" rc=0
    shift
    printf '\n==> %s: %s\n' "$name" "$*"
    "$@" || rc=$?
    if [ "$rc" -ne 0 ]; then
        printf '==> %s FAILED (exit %d)\n' "$name" "$rc"
        failed+=("$name (exit $rc)")
    fi
}

# The compose drill (docker kill of the leader, a network cut, the Spark audit). It runs with the
# full suite only (not with pytest arguments such as -m "not slow"). Exit 3 means no Docker engine
# could be started: the drill prints "COMPOSE DRILL NOT RUN: <reason>" and the rest of the suite
# decides.
compose_drill() {
    local dir rc=0
    dir="$(mktemp -d /tmp/dledger-compose-drill.XXXXXX)"
    "$VENV_BIN/python" -m chaos.cli compose-drill --dir "$dir/run" --rounds 3 || rc=$?
    if [ "$rc" -eq 3 ]; then
        printf '\n######## COMPOSE DRILL NOT RUN (see the reason above) ########\n'
        return 0
    fi
    [ "$rc" -eq 0 ] && rm -rf "$dir" || printf '==> compose drill run kept in %s\n' "$dir"
    return "$rc"
}

step ruff "$VENV_BIN/ruff" check .
step mypy "$VENV_BIN/mypy"
step pytest "$VENV_BIN/python" -m pytest -p no:cacheprovider "$@"
if [ "$#" -eq 0 ]; then
    step compose-drill compose_drill
fi

echo
if [ "${#failed[@]}" -ne 0 ]; then
    printf '==> FAILED: %s\n' "${failed[*]}"
    exit 1
fi
echo "==> all checks passed"
