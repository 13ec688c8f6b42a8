"""Registration with every NameServer: periodic (heartbeat) and at once on demand (role change,
topic change). Invariant 6: a role change reaches the NameServers within a second — ``trigger``
wakes the loop, which registers with all NameServers concurrently (3 s timeout each).

``data_version`` is monotonic per broker process (start ms × 1000 + counter), as the NameServer
requires; the record and its wire form are the protocol's (broker/protocol/routes.py, route_wire.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from broker.client.transport import ClientError, Transport
from broker.protocol.route_wire import registration_to_dict, unregister_to_dict
from broker.protocol.routes import BrokerRegistration, UnregisterRequest
from dledger.clock import SYSTEM, Clock

log = logging.getLogger("broker.registration")


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
        return dataclasses.replace(self._record(), data_version=self._version_base + self._counter)

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
