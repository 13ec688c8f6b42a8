"""Registration with every NameServer: periodic (heartbeat) and at once on demand (role change,
topic change). Invariant 6: a role change reaches the NameServers within a second — ``trigger``
wakes the loop, which registers with all NameServers concurrently (3 s timeout each).

``data_version`` is monotonic per broker process (start ms × 1000 + counter), as the NameServer
requires; the record and its wire form are the protocol's (broker/protocol/routes.py, route_wire.py).

Topics whose names the protocol does not allow (an older release stored ``%DLQ%<group>`` for a
group of up to 255 chars, issue 23) are left out of every registration, logged once each and listed
as ``unroutable`` (``/v1/status`` → ``namesrv.unroutable_topics``): the NameServer refuses a record
holding one, and a single bad name must not keep the rest of the group's topics unroutable. An admin
removes such a topic (docs/OPERATIONS.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from broker.client.transport import ClientError, Transport
from broker.protocol.names import TOPIC_RULE, is_topic
from broker.protocol.route_wire import registration_to_dict, unregister_to_dict
from broker.protocol.routes import BrokerRegistration, UnregisterRequest
from dledger.clock import SYSTEM, Clock

log = logging.getLogger("broker.registration")

UNROUTABLE_LISTED_MAX = 100


class Registrar:
    def __init__(
        self,
        namesrv_addrs: tuple[str, ...],
        record: Callable[[], BrokerRegistration],
        *,
        period_ms: int = 30_000,
        transport: Transport | None = None,
        clock: Clock = SYSTEM,
    ):
        self.addrs = namesrv_addrs
        self._record = record
        self._period_s = period_ms / 1000
        self._transport = transport or Transport(timeout_s=3.0)
        self._wakes = {addr: asyncio.Event() for addr in namesrv_addrs}
        self._clock = clock
        # Versions grow across restarts: a stamp of the wall clock (a timestamp, not a deadline).
        self._version_base = int(clock.wall() * 1000) * 1000
        self._counter = 0
        self.last_ok: dict[str, float] = {}
        self.last_error: dict[str, str] = {}
        self.registrations = 0
        self.last_registered_role: tuple[str, int] | None = None
        self.unroutable: list[str] = []  # topics left out of the last registration (invalid names)

    def trigger(self) -> None:
        for event in self._wakes.values():
            event.set()

    async def run(self) -> None:
        """One loop per NameServer: a slow or dead one never delays the others (invariant 6)."""
        await asyncio.gather(*(self._run_one(addr) for addr in self.addrs))

    async def _run_one(self, addr: str) -> None:
        wake = self._wakes[addr]
        while True:
            wake.clear()
            try:
                await self.register_one(addr)
            except Exception:  # never let one bad round stop registration for good
                log.exception("registration with NameServer %s failed unexpectedly", addr)
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # arrives just as the event is set, and this loop would then outlive stop().
            try:
                async with asyncio.timeout(self._period_s):
                    await wake.wait()
            except TimeoutError:
                pass

    def _record_now(self) -> BrokerRegistration:
        self._counter += 1
        record = self._record()
        routable = tuple(t for t in record.topics if is_topic(t.topic))
        unroutable = sorted(t.topic for t in record.topics if not is_topic(t.topic))
        for name in unroutable:
            if name not in self.unroutable:
                log.error("topic %r is not a valid topic name (%s): left out of the registration; an admin "
                          "deletes it (docs/OPERATIONS.md)", name[:300], TOPIC_RULE)
        self.unroutable = unroutable[:UNROUTABLE_LISTED_MAX]
        return dataclasses.replace(record, topics=routable, data_version=self._version_base + self._counter)

    async def register_all(self) -> None:
        await asyncio.gather(*(self.register_one(addr) for addr in self.addrs))

    async def register_one(self, addr: str) -> None:
        record = self._record_now()
        try:
            await self._register(addr, registration_to_dict(record))
        except Exception as exc:
            msg = str(exc)
            if self.last_error.get(addr) != msg:
                log.warning("registration with NameServer %s failed: %s", addr, msg)
            self.last_error[addr] = msg
        else:
            if addr in self.last_error:
                log.info("registration with NameServer %s works again", addr)
            self.last_error.pop(addr, None)
            self.last_ok[addr] = self._clock.wall()
        self.registrations += 1
        self.last_registered_role = (record.role, record.broker_id)

    async def _register(self, addr: str, body: dict[str, Any]) -> Any:
        return await self._transport.call(addr, "POST", "/v1/brokers/register", body, timeout_s=3.0)

    async def unregister_all(self, cluster: str, broker_name: str, address: str) -> None:
        body = unregister_to_dict(UnregisterRequest(cluster, broker_name, address))

        async def one(addr: str) -> None:
            try:
                await self._transport.call(addr, "POST", "/v1/brokers/unregister", body, timeout_s=2.0)
            except ClientError as exc:
                log.warning("unregister at NameServer %s failed: %s", addr, exc)

        await asyncio.gather(*(one(a) for a in self.addrs))

    async def close(self) -> None:
        await self._transport.close()
