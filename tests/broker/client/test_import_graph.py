"""The SDK's import graph holds no server module (issue 11): an application that imports
``broker.client`` loads the SDK and the shared wire contract (``broker.protocol``), nothing of the
broker process, the NameServer, the replicated log, chaos or Spark."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_sdk_loads_no_server_module() -> None:
    code = (
        "import sys, broker.client\n"
        "[getattr(broker.client, name) for name in broker.client.__all__]  # its names load on first use\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('namesrv', 'dledger', 'chaos', 'spark_jobs')"
        " or (m.startswith('broker.') and not m.startswith(('broker.client', 'broker.protocol'))))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"the SDK imports server modules: {out}"
