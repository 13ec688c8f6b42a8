"""The SDK's wire layer: msgpack over HTTP to brokers, route lookups at NameServers.

Every client object (producer, consumers, admin) owns or shares one ``Transport`` (one aiohttp
session, pooled keep-alive connections). Every failure surfaces as a ``ClientError`` with a
RocketMQ-style ``code``: broker answers keep the broker's code (``NOT_LEADER``, ``TOPIC_NOT_EXIST``,
...); a refused/closed connection is ``CONNECT_FAILED``; no answer in time is ``TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import msgpack

MSGPACK = "application/x-msgpack"
DEFAULT_NAMESRV = "127.0.0.1:9876"


class ClientError(Exception):
    """A failed call: ``code`` names what happened; ``status`` is the HTTP status (0: no answer)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int = 0,
        addr: str | None = None,
        leader_addr: str | None = None,
    ):
        super().__init__(f"{code}: {message}" + (f" ({addr})" if addr else ""))
        self.code = code
        self.message = message
        self.status = status
        self.addr = addr
        self.leader_addr = leader_addr

    @property
    def outcome_unknown(self) -> bool:
        """True when the request may have taken effect (a send to retry with the same unique ids)."""
        return self.code in ("TIMEOUT", "SEND_TIMEOUT", "CONNECTION_LOST")


def parse_addrs(spec: str | Sequence[str] | None) -> list[str]:
    """``"a:9876;b:9877"`` / list / None (then ``NAMESRV_ADDR``, then 127.0.0.1:9876)."""
    if spec is None:
        spec = os.environ.get("NAMESRV_ADDR") or DEFAULT_NAMESRV
    items = spec.replace(",", ";").split(";") if isinstance(spec, str) else list(spec)
    addrs = [a.strip() for a in items if a and a.strip()]
    for a in addrs:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad address {a!r}: expected host:port")
    if not addrs:
        raise ValueError("no NameServer address given")
    return addrs


class Transport:
    def __init__(self, timeout_s: float = 3.0, *, max_connections: int = 256):
        self.timeout_s = timeout_s
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0),
                auto_decompress=False,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def call(
        self,
        addr: str,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """One request; returns the decoded msgpack answer or raises ``ClientError``."""
        session = self._get_session()
        data = msgpack.packb(body, use_bin_type=True) if body is not None else None
        headers = {"Accept": MSGPACK}
        if data is not None:
            headers["Content-Type"] = MSGPACK
        qs = {k: str(v) for k, v in (params or {}).items() if v is not None}
        url = f"http://{addr}{path}"
        timeout = aiohttp.ClientTimeout(total=timeout_s if timeout_s is not None else self.timeout_s)
        try:
            async with session.request(
                method, url, data=data, params=qs, headers=headers, timeout=timeout
            ) as resp:
                raw = await resp.read()
                status = resp.status
                ctype = resp.headers.get("Content-Type", "")
        except TimeoutError:
            raise ClientError("TIMEOUT", f"no answer within {timeout.total} s", addr=addr) from None
        except aiohttp.ClientConnectorError as exc:
            raise ClientError("CONNECT_FAILED", str(exc), addr=addr) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as exc:
            raise ClientError("CONNECTION_LOST", str(exc) or type(exc).__name__, addr=addr) from None
        except aiohttp.ClientError as exc:
            raise ClientError("CONNECT_FAILED", str(exc) or type(exc).__name__, addr=addr) from None
        decoded = _decode(raw, ctype)
        if status >= 400:
            if isinstance(decoded, dict):
                raise ClientError(
                    str(decoded.get("code", f"HTTP_{status}")),
                    str(decoded.get("message", "")),
                    status=status,
                    addr=addr,
                    leader_addr=decoded.get("leader_addr"),
                )
            raise ClientError(f"HTTP_{status}", raw[:200].decode("utf-8", "replace"), status=status, addr=addr)
        return decoded


def _decode(raw: bytes, ctype: str) -> Any:
    if not raw:
        return None
    try:
        if "json" in ctype:
            import json

            return json.loads(raw)
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception:
        return {"code": "BAD_ANSWER", "message": raw[:200].decode("utf-8", "replace")}


# -- routes ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclasses.dataclass(frozen=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]  # 0 = the group's leader

    @property
    def leader_addr(self) -> str | None:
        return self.broker_addrs.get(0)

    def any_addr(self) -> str | None:
        if 0 in self.broker_addrs:
            return self.broker_addrs[0]
        return self.broker_addrs[min(self.broker_addrs)] if self.broker_addrs else None


@dataclasses.dataclass(frozen=True)
class TopicRoute:
    topic: str
    order: bool
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]

    def broker(self, broker_name: str) -> BrokerData | None:
        return next((b for b in self.broker_datas if b.broker_name == broker_name), None)


def route_from_dict(body: Mapping[str, Any]) -> TopicRoute:
    return TopicRoute(
        topic=str(body["topic"]),
        order=bool(body.get("order", False)),
        queue_datas=tuple(
            QueueData(str(q["broker_name"]), int(q["read_queue_nums"]), int(q["write_queue_nums"]), int(q["perm"]))
            for q in body.get("queue_datas", [])
        ),
        broker_datas=tuple(
            BrokerData(
                str(b["cluster"]),
                str(b["broker_name"]),
                {int(k): str(v) for k, v in dict(b.get("broker_addrs", {})).items()},
            )
            for b in body.get("broker_datas", [])
        ),
    )


class NamesrvClient:
    """Asks any NameServer (tried in random order) for routes, clusters and topics."""

    def __init__(self, addrs: str | Sequence[str] | None, transport: Transport):
        self.addrs = parse_addrs(addrs)
        self.transport = transport

    async def _any(self, method: str, path: str, timeout_s: float | None = None) -> Any:
        order = list(self.addrs)
        random.shuffle(order)
        last: ClientError | None = None
        for addr in order:
            try:
                return await self.transport.call(addr, method, path, params={"v": 1}, timeout_s=timeout_s)
            except ClientError as exc:
                if exc.status in (400, 404, 409):  # a real answer: another NameServer says the same
                    raise
                last = exc
        assert last is not None
        raise last

    async def route(self, topic: str, timeout_s: float | None = None) -> TopicRoute:
        from urllib.parse import quote

        body = await self._any("GET", f"/v1/routes/{quote(topic, safe='')}", timeout_s)
        return route_from_dict(body)

    async def clusters(self, timeout_s: float | None = None) -> dict[str, Any]:
        return dict(await self._any("GET", "/v1/clusters", timeout_s))

    async def topics(self, timeout_s: float | None = None) -> list[str]:
        body = await self._any("GET", "/v1/topics", timeout_s)
        return [str(t) for t in body.get("topics", [])]


async def sleep_jitter(base_s: float) -> None:
    await asyncio.sleep(base_s * (0.8 + 0.4 * random.random()))
