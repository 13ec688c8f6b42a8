"""ACL 1.0 (``AclClientRPCHook``) at a remoting server: signatures made by our codec the way the Java hook
makes them, checked against a ``plain_acl.yml``; the operator's policy for that signature
(``remotingAclV1``); and the permissions RocketMQ's PlainAccessValidator asks per request code."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.protocol.auth import AuthError
from broker.protocol.rocketmq import acl as rmq_acl
from broker.protocol.rocketmq import bodies
from broker.protocol.rocketmq import command as rc
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.serving.acl import AclConfig, Perm, parse_acl
from broker.serving.remoting_acl import AclV1Policy, Needs, RemotingAuthenticator, needs_of
from broker.serving.remoting_server import RemotingServer, Request, Route
from broker.serving.security import ALL, NOBODY
from tests.acl_fixtures import ADMIN, CONSUMER, STRANGER, acl_doc
from tests.broker.serving.rmq_client import RmqClient
from tests.dledger.harness import HOST

READ, WRITE = 9101, 9102


def rules(**extra: Any) -> AclConfig:
    import yaml

    doc = acl_doc()
    doc.update(extra)
    return parse_acl(yaml.safe_dump(doc))


def signed(code: int, ext: dict[str, str], body: bytes, access_key: str, secret: str, *,
           token: str | None = None, version: int = rc.VERSION_V4_9_8) -> RemotingCommand:
    return rc.request(code, 1, rmq_acl.sign_request(ext, body, access_key, secret, token), body, version=version)


async def _noop(req: Request) -> None:
    return None


ROUTE_READ = Route(READ, _noop, anonymous=True)
ROUTE_WRITE = Route(WRITE, _noop, writes=True)


def test_authenticate_each_case() -> None:
    acl = rules()
    auth = RemotingAuthenticator(lambda: acl)
    body = b"payload"
    # a good signature, with and without a security token (part of the signed content)
    p = auth.authenticate(signed(WRITE, {"topic": "T"}, body, ADMIN.access_key, ADMIN.secret_key), "10.0.0.1",
                          ROUTE_WRITE)
    assert p.account is not None and p.account.access_key == ADMIN.access_key
    p = auth.authenticate(signed(WRITE, {}, body, ADMIN.access_key, ADMIN.secret_key, token="tok"), "10.0.0.1",
                          ROUTE_WRITE)
    assert p.account is not None
    # unsigned: a read route is served anonymously, a write route is refused
    assert auth.authenticate(rc.request(READ, 1, {"topic": "T"}), "10.0.0.1", ROUTE_READ) is NOBODY
    with pytest.raises(AuthError) as e:
        auth.authenticate(rc.request(WRITE, 1, {"topic": "T"}), "10.0.0.1", ROUTE_WRITE)
    assert e.value.code == "NO_CREDENTIALS"
    with pytest.raises(AuthError) as e:  # no ext fields at all
        auth.authenticate(rc.request(WRITE, 1), "10.0.0.1", ROUTE_WRITE)
    assert e.value.code == "NO_CREDENTIALS"
    # tampered: a header field, the body, the token; a wrong secret; an unknown key
    good = signed(WRITE, {"topic": "T"}, body, ADMIN.access_key, ADMIN.secret_key, token="tok")
    bad = [
        rc.request(WRITE, 1, {**(good.ext_fields or {}), "topic": "U"}, body),
        rc.request(WRITE, 1, good.ext_fields, b"payloae"),
        rc.request(WRITE, 1, {**(good.ext_fields or {}), rmq_acl.SECURITY_TOKEN: "tol"}, body),
        signed(WRITE, {"topic": "T"}, body, ADMIN.access_key, "not-the-secret"),
        signed(WRITE, {"topic": "T"}, body, STRANGER.access_key, STRANGER.secret_key),
        rc.request(WRITE, 1, {**(good.ext_fields or {}), rmq_acl.SIGNATURE: ""}, body),
    ]
    for cmd in bad:
        for route in (ROUTE_READ, ROUTE_WRITE):  # a signed read must verify too
            with pytest.raises(AuthError) as e:
                auth.authenticate(cmd, "10.0.0.1", route)
            assert e.value.code == "SIGNATURE_INVALID"
    assert auth.refused == {"NO_CREDENTIALS": 2, "SIGNATURE_INVALID": 12}
    # ACL off, or a white-listed address: everyone
    assert RemotingAuthenticator(lambda: None).authenticate(bad[0], "10.0.0.1", ROUTE_WRITE) is ALL
    white = rules(globalWhiteRemoteAddresses=["10.10.*.*"])
    assert RemotingAuthenticator(lambda: white).authenticate(bad[0], "10.10.3.4", ROUTE_WRITE) is ALL


def test_clients_up_to_4_9_3_leave_the_unique_key_flag_out_of_the_signature() -> None:
    acl = rules()
    auth = RemotingAuthenticator(lambda: acl)
    ext = {"topic": "T", "key": "k", "maxNum": "32", "beginTimestamp": "0", "endTimestamp": "1"}
    old = signed(RequestCode.QUERY_MESSAGE, ext, b"", CONSUMER.access_key, CONSUMER.secret_key, version=399)
    added = rc.request(old.code, 1, {**(old.ext_fields or {}), "_UNIQUE_KEY_QUERY": "true"}, b"", version=399)
    assert auth.authenticate(added, "10.0.0.1", Route(old.code, _noop)).account is not None


def test_the_acl_v1_policy() -> None:
    acl = rules()
    read = signed(READ, {}, b"", ADMIN.access_key, ADMIN.secret_key)
    write = signed(WRITE, {}, b"", ADMIN.access_key, ADMIN.secret_key)
    readonly = RemotingAuthenticator(lambda: acl, AclV1Policy.READONLY)
    assert readonly.authenticate(read, "10.0.0.1", ROUTE_READ).account is not None
    with pytest.raises(AuthError) as e:
        readonly.authenticate(write, "10.0.0.1", ROUTE_WRITE)
    assert e.value.code == "ACL_V1_REFUSED" and "remotingAclV1=readonly" in e.value.message
    refuse = RemotingAuthenticator(lambda: acl, AclV1Policy.REFUSE)
    for cmd, route in ((read, ROUTE_READ), (write, ROUTE_WRITE)):
        with pytest.raises(AuthError) as e:
            refuse.authenticate(cmd, "10.0.0.1", route)
        assert e.value.code == "ACL_V1_REFUSED"
    # what stays: anonymous reads, and white-listed addresses
    assert refuse.authenticate(rc.request(READ, 1), "10.0.0.1", ROUTE_READ) is NOBODY
    white = rules(globalWhiteRemoteAddresses=["10.10.0.0/16"])
    assert RemotingAuthenticator(lambda: white, AclV1Policy.REFUSE).authenticate(write, "10.10.1.1",
                                                                                 ROUTE_WRITE) is ALL


def test_a_reloaded_acl_file_takes_effect_at_once() -> None:
    current = [rules()]
    auth = RemotingAuthenticator(lambda: current[0])
    cmd = signed(WRITE, {}, b"", "newcomer", "newcomer-secret-1")
    with pytest.raises(AuthError):
        auth.authenticate(cmd, "10.0.0.1", ROUTE_WRITE)
    current[0] = rules(accounts=[*acl_doc()["accounts"],
                                 {"accessKey": "newcomer", "secretKey": "newcomer-secret-1", "admin": False}])
    assert auth.authenticate(cmd, "10.0.0.1", ROUTE_WRITE).account is not None


def test_refusals_answer_no_permission_over_the_wire() -> None:
    """Through a real server: NO_PERMISSION (16, as RocketMQ 5.3's authorization answers) with the reason;
    the connection stays."""

    async def scenario() -> None:
        acl = rules()
        server = RemotingServer(authenticator=RemotingAuthenticator(lambda: acl))

        async def admin_only(req: Request) -> RemotingCommand:
            req.require(admin=True)
            return req.ok()

        async def read(req: Request) -> RemotingCommand:
            if req.principal.account is not None:  # a signed read: the account's permissions count
                req.require(topics={"T": Perm.SUB})
            return req.ok()

        server.route(WRITE, admin_only, writes=True)
        server.route(READ, read, anonymous=True)
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(server, HOST, 0)
        addr = f"{HOST}:{srv.sockets[0].getsockname()[1]}"
        try:
            anonymous = await RmqClient.connect(addr)
            r = await anonymous.call(WRITE, {"x": "1"})
            assert r.code == ResponseCode.NO_PERMISSION and (r.remark or "").startswith("NO_CREDENTIALS: ")
            assert (await anonymous.call(READ)).code == ResponseCode.SUCCESS
            consumer = await RmqClient.connect(addr, credentials=(CONSUMER.access_key, CONSUMER.secret_key))
            r = await consumer.call(WRITE, {"x": "1"}, b"body")
            assert r.code == ResponseCode.NO_PERMISSION and "not an admin account" in (r.remark or "")
            assert (await consumer.call(READ, {"topic": "T"})).code == ResponseCode.SUCCESS
            admin = await RmqClient.connect(addr, credentials=(ADMIN.access_key, ADMIN.secret_key))
            assert (await admin.call(WRITE, {"x": "1"}, b"body")).code == ResponseCode.SUCCESS
            forger = await RmqClient.connect(addr, credentials=(ADMIN.access_key, "guessed-secret-1"))
            r = await forger.call(WRITE, {"x": "1"})
            assert r.code == ResponseCode.NO_PERMISSION and (r.remark or "").startswith("SIGNATURE_INVALID")
            assert server.stats.auth_refused == 3
            for c in (anonymous, consumer, admin, forger):
                await c.close()
        finally:
            await server.stop()
            srv.close()
            await srv.wait_closed()

    asyncio.run(scenario())


# -- RocketMQ's permission table ------------------------------------------------------------------------------
def test_needs_of_follows_rocketmq_plain_access_validator() -> None:
    sub, pub = Perm.SUB, Perm.PUB
    assert needs_of(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "T"}) == Needs(admin=True)
    assert needs_of(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "g"}) == Needs(admin=True)
    assert needs_of(RequestCode.SEND_MESSAGE, {"topic": "T", "producerGroup": "pg"}) == Needs(topics=(("T", pub),))
    assert needs_of(RequestCode.SEND_MESSAGE_V2, {"b": "T", "a": "pg"}) == Needs(topics=(("T", pub),))
    assert needs_of(RequestCode.SEND_BATCH_MESSAGE, {"b": "T", "a": "pg"}) == Needs(topics=(("T", pub),))
    # a message sent back to a retry topic: the group's subscription
    assert needs_of(RequestCode.SEND_MESSAGE_V2, {"b": "%RETRY%cg", "a": "cg"}) == Needs(groups=(("cg", sub),))
    assert needs_of(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "cg"}) == Needs(groups=(("cg", sub),))
    for code in (RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE, RequestCode.UPDATE_CONSUMER_OFFSET,
                 RequestCode.QUERY_CONSUMER_OFFSET):
        assert needs_of(code, {"topic": "T", "consumerGroup": "cg"}) == Needs(topics=(("T", sub),),
                                                                             groups=(("cg", sub),))
    assert needs_of(RequestCode.QUERY_MESSAGE, {"topic": "T"}) == Needs(topics=(("T", sub),))
    assert needs_of(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"}) == Needs(groups=(("cg", sub),))
    # a producer's UNREGISTER_CLIENT names no consumer group: a valid signature is enough
    assert needs_of(RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "producerGroup": "pg"}) == Needs()
    beat = bodies.encode(bodies.HeartbeatData(client_id="c", consumer_data_set=(
        bodies.ConsumerData(group_name="cg", subscription_data_set=(
            bodies.SubscriptionData(topic="T1", sub_string="*"), bodies.SubscriptionData(topic="T2", sub_string="a"))),
    ), producer_data_set=(bodies.ProducerData(group_name="pg"),)))
    needs = needs_of(RequestCode.HEART_BEAT, None, beat)
    assert needs.topic_map() == {"T1": sub, "T2": sub} and needs.group_map() == {"cg": sub}
    # everything else: a valid signature only
    assert needs_of(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}) == Needs()
    assert needs_of(RequestCode.GET_BROKER_RUNTIME_INFO, None) == Needs()
