"""Container health check: ``python3 -m dledger.healthcheck`` exits 0 when ``$HEALTH_URL`` (the
process's own ``/v1/status``) answers 200 within 2 s, else 1 with a one-line reason."""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    url = os.environ.get("HEALTH_URL", "http://127.0.0.1:9876/v1/status")
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            if resp.status == 200:
                return 0
            print(f"unhealthy: {url} answered {resp.status}", file=sys.stderr)
    except (OSError, urllib.error.URLError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
