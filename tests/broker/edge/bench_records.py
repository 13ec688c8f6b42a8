"""The record path of every send and pull (``broker.store.message``: build, encode, decode, the API's message
map), main's module against this checkout's, in one process (issue 25 added an optional ``sys_flag``):

    git show main:broker/store/message.py > /tmp/message_main.py
    .venv/bin/python -m tests.broker.edge.bench_records /tmp/message_main.py

Prints µs per message, best of 7 rounds of 300 batches of 32 messages (1 KiB bodies), twice each.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from types import ModuleType
from typing import Any

import broker.store.message as current


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("message_main", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench(mod: Any, label: str) -> None:
    items = [{"body": b"x" * 1024, "tags": "TagA", "keys": ["k1"], "properties": {"a": "1"}, "unique_id": "AB" * 16,
              "born_ts": 1, "born_host": "1.2.3.4"} for _ in range(32)]
    best = float("inf")
    for _ in range(7):
        t = time.process_time()
        for _ in range(300):
            msgs = mod.build_messages("T", 0, items, store_ts=5, max_size=4 << 20, new_unique_id=lambda: "N",
                                      default_born_host="", queue_ids_max=4)
            decoded = [mod.decode_message(mod.encode_message(m)) for m in msgs]
            for m in decoded:
                mod.message_view(m, broker_name="B", position=1, size=2, queue_offset=3)
        best = min(best, (time.process_time() - t) / (300 * 32) * 1e6)
    print(f"{label}: build + encode + decode + view {best:.2f} µs per message (best of 7)")


def main() -> int:
    old = load(sys.argv[1])
    for _ in range(2):
        bench(old, "main")
        bench(current, "this checkout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
