"""``AdminBase``: the transport and NameServer client of ``Admin`` and the building blocks its calls are
composed of (reads leader first, writes following ``NOT_LEADER`` once, fan-out to every group of a
cluster). The calls by area are built over it in ``admin_cluster.py`` and ``admin_messages.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from broker.client.admin_checks import check_addr, check_name
from broker.client.admin_records import FanOutError, InvalidArgument, Outcome
from broker.client.transport import FROM_ENV, ClientError, CredentialsArg, NamesrvClient, TlsArg, Transport
from broker.protocol.frames import Op
from broker.protocol.routes import BrokerData


class AdminBase:
    """The connection state of ``Admin`` and the building blocks every admin call is made of."""

    def __init__(
        self,
        namesrv: str | Sequence[str] | None = None,
        transport: Transport | None = None,
        *,
        timeout_s: float = 3.0,
        credentials: CredentialsArg = FROM_ENV,
        tls: TlsArg = FROM_ENV,
    ):
        try:
            self._owns_transport = transport is None
            self.transport = transport or Transport(timeout_s, credentials=credentials, tls=tls)
            self.namesrv = NamesrvClient(namesrv, self.transport)
        except ValueError as exc:
            raise InvalidArgument("INVALID_ADDRESS", str(exc)) from None

    async def close(self) -> None:
        if self._owns_transport:
            await self.transport.close()

    # -- building blocks (public: mqadmin and the dashboard compose their commands from them) ----
    async def read(self, bd: BrokerData, path: str, params: Mapping[str, Any] | None = None) -> Any:
        """GET from the group's replicas, leader first; the next one only when one is unreachable."""
        last: ClientError | None = None
        for addr in bd.addrs_leader_first():
            try:
                return await self.transport.call(addr, "GET", path, params=params)
            except ClientError as exc:
                if exc.status:  # the replica answered: another one would say the same
                    raise
                last = exc
        if last is not None:
            raise last
        raise ClientError("NO_BROKER", f"broker group {bd.broker_name} has no registered address")

    async def write_addr(
        self, addr: str, method: str, path: str, body: Mapping[str, Any] | None
    ) -> tuple[Any, str]:
        """One write; a ``NOT_LEADER`` answer naming another leader is followed once.
        Returns the answer and the address that gave it."""
        return await self._follow_leader(addr, lambda a: self.transport.call(a, method, path, body))

    async def _follow_leader(self, addr: str, call: Callable[[str], Awaitable[Any]]) -> tuple[Any, str]:
        try:
            return await call(addr), addr
        except ClientError as exc:
            if exc.code != "NOT_LEADER" or not exc.leader_addr or exc.leader_addr == addr:
                raise
            leader = exc.leader_addr
        return await call(leader), leader

    async def write(
        self, bd: BrokerData, method: str, path: str, body: Mapping[str, Any] | None
    ) -> tuple[Any, str]:
        """To the group's leader (id 0) when known, else to a follower, which redirects. A replica
        that cannot be connected to never saw the request, so the next one is tried (a stale route
        whose leader died); any other failure — a timeout may have applied the write — is final."""
        return await self._to_group(bd, lambda addr: self.write_addr(addr, method, path, body))

    async def operation(self, bd: BrokerData, op: Op, body: Mapping[str, Any]) -> tuple[Any, str]:
        """A data-path operation (``Op.SEND``) on the group's leader, sent like ``write``: over the
        binary port when the route advertised one, else over HTTP (``Transport.operation``)."""
        return await self._to_group(
            bd, lambda addr: self._follow_leader(addr, lambda a: self.transport.operation(a, op, body))
        )

    async def _to_group(self, bd: BrokerData, call: Callable[[str], Awaitable[tuple[Any, str]]]) -> tuple[Any, str]:
        last: ClientError | None = None
        for addr in bd.addrs_leader_first():
            try:
                return await call(addr)
            except ClientError as exc:
                if exc.code != "CONNECT_FAILED" or exc.addr != addr:
                    raise
                last = exc
        if last is not None:
            raise last
        raise ClientError("NO_BROKER", f"broker group {bd.broker_name} has no registered address")

    async def cluster_groups(self, cluster: str) -> list[BrokerData]:
        """The broker groups of ``cluster`` as the NameServer knows them (``CLUSTER_NOT_EXIST``: none)."""
        info = await self.namesrv.clusters()
        names = info.clusters.get(cluster)
        if names is None:
            raise ClientError("CLUSTER_NOT_EXIST", f"no cluster {cluster!r} is registered", status=404)
        return [info.brokers[n] for n in names if n in info.brokers]

    async def all_groups(self) -> list[BrokerData]:
        """Every broker group registered at the NameServer, by name."""
        info = await self.namesrv.clusters()
        return [info.brokers[n] for n in sorted(info.brokers)]

    async def fan_out_groups(
        self,
        groups: Sequence[BrokerData],
        call: Callable[[BrokerData], Awaitable[tuple[Any, str]]],
        *,
        absent_ok: bool = False,
    ) -> list[Outcome]:
        """``call`` on every group at once, one ``Outcome`` per group in order (a ``ClientError``
        becomes a failed outcome, a 404 with ``absent_ok`` an absent one)."""

        async def one(bd: BrokerData) -> Outcome:
            addr = bd.any_addr()
            try:
                answer, landed = await call(bd)
            except ClientError as exc:
                if absent_ok and exc.status == 404:
                    return Outcome(
                        "broker", bd.broker_name, exc.addr or addr, True, "NOT_EXIST", exc.message, 404
                    )
                return Outcome(
                    "broker", bd.broker_name, exc.addr or addr, False, exc.code, exc.message, exc.status
                )
            return Outcome("broker", bd.broker_name, landed, True, "OK", answer=answer)

        return list(await asyncio.gather(*(one(bd) for bd in groups)))

    async def _write_targets(
        self, body: Mapping[str, Any], path: str, *, cluster: str | None, broker_addr: str | None
    ) -> list[Outcome]:
        """POST ``body`` to one broker (``broker_addr``) or to every group leader of ``cluster``."""
        if (cluster is None) == (broker_addr is None):
            raise InvalidArgument(
                "BAD_REQUEST", "give exactly one of a cluster (-c) or a broker address (-b)"
            )
        if broker_addr is not None:
            check_addr(broker_addr)
            try:
                answer, landed = await self.write_addr(broker_addr, "POST", path, body)
            except ClientError as exc:
                outcome = Outcome(
                    "broker", broker_addr, exc.addr or broker_addr, False, exc.code, exc.message, exc.status
                )
                raise FanOutError([outcome]) from None
            return [Outcome("broker", broker_addr, landed, True, "OK", answer=answer)]
        assert cluster is not None
        groups = await self.cluster_groups(check_name(cluster, "cluster"))
        if not groups:
            raise ClientError("CLUSTER_NOT_EXIST", f"cluster {cluster!r} has no broker group", status=404)
        outcomes = await self.fan_out_groups(groups, lambda bd: self.write(bd, "POST", path, body))
        if not all(o.ok for o in outcomes):
            raise FanOutError(outcomes)
        return outcomes

    async def _route_group(self, topic: str, broker_name: str) -> BrokerData:
        route = await self.namesrv.route(topic)
        bd = route.broker(broker_name)
        if bd is None:
            raise ClientError(
                "BROKER_NOT_EXIST", f"broker group {broker_name!r} serves no queue of {topic!r}", status=404
            )
        return bd
