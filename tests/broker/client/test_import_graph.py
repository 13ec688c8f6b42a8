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


def test_the_rocketmq_wire_loads_only_the_wire_contract() -> None:
    """``broker.protocol.rocketmq`` is a pure codec: importing it loads no msgpack and no module of
    the broker outside ``broker.protocol``."""
    code = (
        "import sys, broker.protocol.rocketmq as r\n"
        "from broker.protocol.rocketmq import acl, bodies, codes, command, fastjson, headers, jsonbean, message\n"
        "from broker.protocol.rocketmq import properties\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('msgpack', 'namesrv', 'dledger', 'chaos',"
        " 'spark_jobs') or (m.startswith('broker.') and not m.startswith('broker.protocol')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"broker.protocol.rocketmq imports: {out}"
