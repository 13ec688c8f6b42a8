"""``chaos drill``: three kill -9 rounds against a private ``dledger-cluster`` (OS processes)."""

from __future__ import annotations

import io
import json
import random

import pytest

from chaos.drill import DrillOptions, run_drill

pytestmark = pytest.mark.slow


async def test_three_round_drill_times_failover_and_loses_nothing() -> None:
    seed = random.randrange(1 << 30)
    base = random.Random(seed).randrange(20000, 27000, 100)
    print(f"seed {seed}, port base {base}")
    out = io.StringIO()
    rc = await run_drill(DrillOptions(rounds=3, producers=4, steady_s=1.0, port_base=base), as_json=True, out=out)
    result = json.loads(out.getvalue())
    print(json.dumps(result["summary"]))
    assert rc == 0
    assert [r["round"] for r in result["rounds"]] == [1, 2, 3]
    for r in result["rounds"]:
        assert r["killed"] != r["new_leader"] and r["new_term"] > r["killed_term"]
        assert 0 < r["route_ms"] < 30_000 and 0 < r["first_ack_ms"] < 30_000
        assert r["lost"] == 0
    assert result["summary"]["lost"] == 0 and result["acknowledged"] > 100
