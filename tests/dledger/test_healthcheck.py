"""The container health check's readiness mode (a Kubernetes readiness probe, docker/helm)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dledger.apps import healthcheck
from dledger.apps.healthcheck import readiness


def test_readiness_rules() -> None:
    assert readiness({"role": "LEADER", "writable": True}, 1000) is None
    assert "not writable" in str(readiness({"role": "LEADER", "writable": False}, 1000))
    assert readiness({"role": "FOLLOWER", "leader_id": "n0", "applied_index": 10, "commit_index": 1010}, 1000) is None
    assert "catching up" in str(readiness({"role": "FOLLOWER", "leader_id": "n0", "applied_index": 9,
                                           "commit_index": 1010}, 1000))
    assert "without a known leader" in str(readiness({"role": "FOLLOWER", "leader_id": None}, 1000))
    assert readiness({"role": "CANDIDATE"}, 1000) == "role CANDIDATE"
    assert "no applied" in str(readiness({"role": "FOLLOWER", "leader_id": "n0"}, 1000))
    assert readiness({"v": 1, "brokers": []}, 1000) is None  # a NameServer's status has no role


@pytest.fixture
def status_server() -> Iterator[tuple[str, dict[str, Any]]]:
    answer: dict[str, Any] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/status", answer
    finally:
        server.shutdown()
        server.server_close()


def test_main_live_and_ready(status_server: tuple[str, dict[str, Any]], monkeypatch: Any) -> None:
    url, answer = status_server
    monkeypatch.setenv("HEALTH_URL", url)
    answer.update({"role": "CANDIDATE"})
    assert healthcheck.main() == 0  # alive: it answers
    monkeypatch.setenv("HEALTH_MODE", "ready")
    assert healthcheck.main() == 1
    answer.update({"role": "FOLLOWER", "leader_id": "n1", "applied_index": 5, "commit_index": 7})
    assert healthcheck.main() == 0
    monkeypatch.setenv("HEALTH_LAG_MAX", "1")
    assert healthcheck.main() == 1
    monkeypatch.setenv("HEALTH_LAG_MAX", "x")
    assert healthcheck.main() == 2
