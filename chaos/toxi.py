"""A real Toxiproxy server for a chaos run, and the run's proxies and toxics through toxiproxy-python.

The server binary is ``.ci/bin/toxiproxy-server`` (``bash .ci/setup.sh`` builds it), or
``$TOXIPROXY_SERVER``, or ``toxiproxy-server`` on PATH; when none exists the run stops with
``ToxiproxyMissing`` naming those places — it never runs without its network faults.

toxiproxy-python keeps the API address in class attributes and calls ``requests`` without
timeouts: ``use_api`` points it at our server and gives its requests a default timeout (every
network wait is bounded). Its calls block, so async callers run them in a thread.

Toxics are named ``chaos_<type>_<stream>`` and applied to both streams of a proxy (upstream: the
connecting side's bytes, downstream: the answers). Disabling a proxy closes its connections and
refuses new ones (a clean cut: peers see resets); the ``timeout`` toxic with timeout 0 holds data
forever instead (a black hole: peers see silence until their own timeouts fire).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import requests
import toxiproxy
import toxiproxy.api

from chaos.layout import ProxySpec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLED_SERVER = os.path.join(REPO, ".ci", "bin", "toxiproxy-server")
API_TIMEOUT_S = 5.0
TOXIC_PREFIX = "chaos_"

# Default toxic attributes (Toxiproxy's units: ms, KB/s, bytes, µs).
TOXIC_DEFAULTS: dict[str, dict[str, int]] = {
    "latency": {"latency": 100, "jitter": 50},  # OpenChaos's 100 ± 50 ms, each direction
    "bandwidth": {"rate": 64},  # KB/s each direction
    "timeout": {"timeout": 0},  # 0: hold the data until the toxic is removed (a black hole)
    "reset_peer": {"timeout": 500},  # every connection is reset 500 ms after it is opened
    "slicer": {"average_size": 64, "size_variation": 32, "delay": 200},  # bytes, bytes, µs
}


class ToxiproxyMissing(RuntimeError):
    """No Toxiproxy server binary, or the server does not answer."""


def find_server_binary(explicit: str | None = None) -> str:
    candidates = [explicit, os.environ.get("TOXIPROXY_SERVER"), BUNDLED_SERVER, shutil.which("toxiproxy-server")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise ToxiproxyMissing(
        "the Toxiproxy server is not installed: run `bash .ci/setup.sh` (it builds "
        f"{BUNDLED_SERVER}), or set TOXIPROXY_SERVER=/path/to/toxiproxy-server, or put "
        "toxiproxy-server on PATH. Chaos runs need it for their network faults and partitions."
    )


class _TimedRequests:
    """``requests`` with a default timeout, for toxiproxy-python (which passes none)."""

    def __getattr__(self, name: str) -> Any:
        fn = getattr(requests, name)
        if name in ("get", "post", "delete", "put", "patch"):
            return functools.partial(_with_timeout, fn)
        return fn


def _with_timeout(fn: Any, *args: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("timeout", API_TIMEOUT_S)
    return fn(*args, **kwargs)


def use_api(host: str, port: int) -> toxiproxy.Toxiproxy:
    toxiproxy.api.requests = _TimedRequests()
    client = toxiproxy.Toxiproxy()
    client.update_api_consumer(host, port)
    return client


class ToxiproxyServer:
    """One ``toxiproxy-server`` process, started detached and ended by its PID."""

    def __init__(self, host: str, port: int, log_path: str, binary: str | None = None):
        self.host, self.port, self.log_path = host, port, log_path
        self.binary = find_server_binary(binary)
        self.pid = 0
        self._child: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        with open(self.log_path, "ab") as logf:
            child = subprocess.Popen(
                [self.binary, "-host", self.host, "-port", str(self.port), "-proxy-metrics"],
                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, close_fds=True, env={**os.environ, "LOG_LEVEL": "info"},
            )
        self.pid, self._child = child.pid, child
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if child.poll() is not None:
                raise ToxiproxyMissing(f"toxiproxy-server exited with {child.returncode}; see {self.log_path}")
            with contextlib.suppress(requests.RequestException):  # the client stack toxiproxy-python uses
                if requests.get(f"http://{self.host}:{self.port}/version", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        self.stop()
        raise ToxiproxyMissing(f"toxiproxy-server did not answer on {self.host}:{self.port} within {timeout_s} s")

    def is_running(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            return False
        return self.pid > 0 and str(self.port).encode() in cmd

    def stop(self, timeout_s: float = 5.0) -> None:
        if not self.is_running():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.is_running() and time.monotonic() < deadline:
            if self._child is not None:
                self._child.poll()  # reaps it once it exited
            time.sleep(0.05)
        if self.is_running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self._child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._child.wait(timeout=timeout_s)


class ProxyNetwork:
    """The run's proxies on one Toxiproxy server. Blocking calls (run them in a thread from async code)."""

    def __init__(self, host: str, port: int, specs: Sequence[ProxySpec]):
        self.api = f"{host}:{port}"
        self.client = use_api(host, port)
        self.specs = {s.link: s for s in specs}
        self._proxies: dict[str, toxiproxy.Proxy] = {}

    def create_all(self) -> None:
        existing = self.client.proxies()
        for s in self.specs.values():
            if s.name in existing:
                existing[s.name].destroy()
            self._proxies[s.name] = self.client.create(upstream=s.upstream, name=s.name, listen=s.listen,
                                                       enabled=True)

    def _proxy(self, spec: ProxySpec) -> toxiproxy.Proxy:
        p = self._proxies.get(spec.name)
        if p is None:
            p = self.client.get_proxy(spec.name)
            if p is None:
                raise ToxiproxyMissing(f"proxy {spec.name} is missing on the Toxiproxy server {self.api}")
            self._proxies[spec.name] = p
        return p

    def cut(self, specs: Sequence[ProxySpec]) -> None:
        for s in specs:
            self._proxy(s).disable()

    def restore(self, specs: Sequence[ProxySpec]) -> None:
        for s in specs:
            self._proxy(s).enable()

    def add_toxic(
        self, specs: Sequence[ProxySpec], toxic_type: str, attributes: dict[str, int],
        streams: Sequence[str] = ("upstream", "downstream"),
    ) -> None:
        for s in specs:
            p = self._proxy(s)
            for stream in streams:
                p.add_toxic(type=toxic_type, stream=stream, name=f"{TOXIC_PREFIX}{toxic_type}_{stream}",
                            toxicity=1.0, attributes=attributes)

    def remove_toxics(self, specs: Sequence[ProxySpec]) -> None:
        for s in specs:
            p = self._proxy(s)
            for name in p.toxics():
                if name.startswith(TOXIC_PREFIX):
                    p.destroy_toxic(name)

    def heal_all(self) -> None:
        """Every proxy enabled, every toxic removed (Toxiproxy's reset)."""
        self.client.reset()

    def state(self) -> dict[str, dict[str, Any]]:
        """Per link: enabled, and the names of its toxics."""
        live = self.client.proxies()
        out = {}
        for link, s in self.specs.items():
            p = live[s.name]
            out[link] = {"enabled": p.enabled, "toxics": sorted(p.toxics())}
        return out

    def bytes_by_link(self) -> dict[str, int]:
        """Bytes each proxy forwarded so far, both directions (the server's Prometheus counters)."""
        text = requests.get(f"http://{self.api}/metrics", timeout=API_TIMEOUT_S).text
        by_name: dict[str, int] = {}
        for m in _SENT_RE.finditer(text):
            by_name[m.group("proxy")] = by_name.get(m.group("proxy"), 0) + int(float(m.group("value")))
        return {link: by_name.get(s.name, 0) for link, s in self.specs.items()}


_SENT_RE = re.compile(r'^toxiproxy_proxy_sent_bytes_total\{[^}]*proxy="(?P<proxy>[^"]+)"[^}]*\}\s+(?P<value>\S+)$',
                      re.MULTILINE)
