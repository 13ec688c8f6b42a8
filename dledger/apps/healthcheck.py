"""Container health check: ``python3 -m dledger.apps.healthcheck`` exits 0 when ``$HEALTH_URL`` (the
process's own ``/v1/status``) answers 200 within 2 s, else 1 with a one-line reason. An https URL
is verified against ``$HEALTH_CA_FILE`` when set (the compose cluster's private CA)."""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request


def main() -> int:
    url = os.environ.get("HEALTH_URL", "http://127.0.0.1:9876/v1/status")
    ca = os.environ.get("HEALTH_CA_FILE")
    try:
        ctx = ssl.create_default_context(cafile=ca) if url.startswith("https:") and ca else None
        with urllib.request.urlopen(url, timeout=2.0, context=ctx) as resp:
            if resp.status == 200:
                return 0
            print(f"unhealthy: {url} answered {resp.status}", file=sys.stderr)
    except (OSError, urllib.error.URLError, ssl.SSLError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
