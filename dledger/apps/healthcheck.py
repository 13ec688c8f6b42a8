"""Container health check: ``python3 -m dledger.apps.healthcheck`` exits 0 when ``$HEALTH_URL`` (the
process's own ``/v1/status``) answers 200 within 2 s, else 1 with a one-line reason. An https URL
is verified against ``$HEALTH_CA_FILE`` when set (the compose cluster's private CA).

``HEALTH_MODE=ready`` (a Kubernetes readiness probe, docs/OPERATIONS.md): 0 only for a broker
replica that can do its part — a writable leader (ready: applied what it committed before its
election), or a follower that knows its leader and has applied to within ``$HEALTH_LAG_MAX``
entries (default 1000) of its commit index. A candidate, a follower without a leader, a replica
still catching up, or a leader not yet writable is not ready (exit 1, the reason on stderr).
NameServers have no ``role``: a 200 is ready.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from typing import Any

LAG_MAX_DEFAULT = 1000


def readiness(status: dict[str, Any], lag_max: int) -> str | None:
    """None when ready, else why not (pure)."""
    role = status.get("role")
    if role is None:  # a NameServer
        return None
    if role == "LEADER":
        return None if status.get("writable") else "leader not writable yet (applying what it committed before)"
    if role != "FOLLOWER":
        return f"role {role}"
    if not status.get("leader_id"):
        return "follower without a known leader"
    applied, commit = status.get("applied_index"), status.get("commit_index")
    if not isinstance(applied, int) or not isinstance(commit, int):
        return "no applied/commit index in the status"
    if commit - applied > lag_max:
        return f"catching up: applied {applied}, commit {commit} (more than {lag_max} behind)"
    return None


def main() -> int:
    url = os.environ.get("HEALTH_URL", "http://127.0.0.1:9876/v1/status")
    ca = os.environ.get("HEALTH_CA_FILE")
    mode = os.environ.get("HEALTH_MODE", "live")
    try:
        lag_max = int(os.environ.get("HEALTH_LAG_MAX", LAG_MAX_DEFAULT))
    except ValueError:
        print(f"unhealthy: HEALTH_LAG_MAX={os.environ.get('HEALTH_LAG_MAX')!r} is not an integer", file=sys.stderr)
        return 2
    try:
        ctx = ssl.create_default_context(cafile=ca) if url.startswith("https:") and ca else None
        with urllib.request.urlopen(url, timeout=2.0, context=ctx) as resp:
            if resp.status != 200:
                print(f"unhealthy: {url} answered {resp.status}", file=sys.stderr)
                return 1
            if mode != "ready":
                return 0
            status = json.loads(resp.read(1 << 20))
    except (OSError, urllib.error.URLError, ssl.SSLError, ValueError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    why = readiness(status, lag_max) if isinstance(status, dict) else "the status is not a JSON object"
    if why is not None:
        print(f"not ready: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
