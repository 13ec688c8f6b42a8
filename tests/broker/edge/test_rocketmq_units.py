"""The broker's RocketMQ edge without sockets: our records in RocketMQ's stored layout and back (broker/edge/
rocketmq/messages.py), the response code of each service error (errors.py), the clients' connections
(channels.py), orderly consumers' queue locks and subscriptions (broker/service/consumers.py), and the records'
optional ``sys_flag`` (broker/store/message.py)."""

from __future__ import annotations

import zlib
from typing import Any

import msgpack
import pytest

from broker.edge.rocketmq import messages
from broker.edge.rocketmq.channels import CLIENTS_PER_CONNECTION_MAX, Channel, ClientChannels, TooManyClients
from broker.edge.rocketmq.errors import CODES, code_of, command_error
from broker.protocol.auth import AuthError
from broker.protocol.errors import ProtocolError
from broker.protocol.rocketmq import message as rm
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.codes import ResponseCode as R
from broker.service.consumers import LOCK_EXPIRY_MS, MAX_LOCKS, ConsumerManager, QueueLocks, Subscription
from broker.serving.remoting_server import RemotingServer, response_code
from broker.store.message import (
    MESSAGE_MAGIC,
    StoredMessage,
    build_messages,
    decode_message,
    encode_message,
    make_msg_id,
)
from broker.store.record_rules import admit_message

STORE = rm.Host(bytes([10, 0, 0, 7]), 10911)


def stored(**kw: Any) -> StoredMessage:
    base: dict[str, Any] = dict(topic="T", queue_id=2, flag=5, tags="TagA", keys=("k1", "k2"), properties={"a": "1"},
                                born_ts=1000, born_host="192.0.2.9:51000", store_ts=2000, unique_id="AB" * 16,
                                body=b"body")
    base.update(kw)
    return StoredMessage(**base)


def wire(m: StoredMessage, **kw: Any) -> rm.StoredMessage:
    parts = messages.stored_layout(m, queue_offset=kw.get("queue_offset", 9), position=kw.get("position", 4242),
                                   store_host=STORE, broker_name="RaftNode00", hosts=messages.HostCache())
    decoded, end = rm.decode_stored(b"".join(parts))
    assert end == sum(map(len, parts))
    return decoded


# -- records in the stored layout --------------------------------------------------------------------------
def test_a_record_in_the_stored_layout() -> None:
    w = wire(stored())
    assert (w.topic, w.body, w.queue_id, w.flag, w.queue_offset, w.commit_log_offset) == ("T", b"body", 2, 5, 9, 4242)
    assert (w.born_timestamp, str(w.born_host), w.store_timestamp, w.store_host) == (1000, "192.0.2.9:51000", 2000,
                                                                                      STORE)
    assert w.properties == {"a": "1", rp.TAGS: "TagA", rp.KEYS: "k1 k2", rp.UNIQ_KEY: "AB" * 16}
    assert w.sys_flag == 0 and w.reconsume_times == 0 and w.prepared_transaction_offset == 0
    assert w.offset_msg_id == rm.make_offset_msg_id(STORE, 4242)


def test_retries_transactions_compression_and_ipv6_in_the_stored_layout() -> None:
    origin = make_msg_id("RaftNode00", 77)
    w = wire(stored(properties={"RECONSUME_TIME": "3", "__TXN_HALF_POS": "123", "ORIGIN_MESSAGE_ID": origin,
                                "RETRY_TOPIC": "T"},
                    sys_flag=rp.COMPRESSED_FLAG | rp.COMPRESSION_ZLIB_TYPE, born_host="[2001:db8::1]:7"))
    assert w.reconsume_times == 3 and w.prepared_transaction_offset == 123
    assert w.properties["ORIGIN_MESSAGE_ID"] == rm.make_offset_msg_id(STORE, 77)  # resolvable at this store host
    assert w.sys_flag & rp.COMPRESSED_FLAG and rp.compression_type(w.sys_flag) == 3
    assert w.sys_flag & rp.BORNHOST_V6_FLAG and str(w.born_host) == "[2001:db8::1]:7"
    other = wire(stored(properties={"ORIGIN_MESSAGE_ID": make_msg_id("OtherGroup", 5), "RECONSUME_TIME": "x"}))
    assert other.properties["ORIGIN_MESSAGE_ID"] == make_msg_id("OtherGroup", 5) and other.reconsume_times == 0


@pytest.mark.parametrize("born", ["", "localhost:80", "host", "1.2.3.4:99999", "[::1]", "1.2.3.4"])
def test_born_hosts_that_are_no_ip_port(born: str) -> None:
    w = wire(stored(born_host=born))
    expect = {"[::1]": "[::1]:0", "1.2.3.4": "1.2.3.4:0"}.get(born, "0.0.0.0:0")
    assert str(w.born_host) == expect


def test_properties_beyond_rocketmqs_length_keep_the_system_ones() -> None:
    huge = {f"p{i}": "v" * 1000 for i in range(40)}  # our API allows 32 KiB of values, RocketMQ's layout 32767 B
    w = wire(stored(properties={**huge, "RETRY_TOPIC": "T"}, keys=tuple(f"k{i}" * 100 for i in range(30))))
    assert w.properties == {rp.TAGS: "TagA", rp.UNIQ_KEY: "AB" * 16, "RETRY_TOPIC": "T"}


def test_a_rocketmq_send_as_our_message() -> None:
    props = {rp.TAGS: "TagA", rp.KEYS: "k1  k2", rp.UNIQ_KEY: "U1", rp.WAIT_STORE_MSG_OK: "true", "DELAY": "2",
             "user": "x"}
    item = messages.message_in(b"b", 3, rp.COMPRESSED_FLAG | rp.BORNHOST_V6_FLAG | rp.TRANSACTION_PREPARED_TYPE,
                               props, 99, "1.2.3.4:5")
    assert item == {"body": b"b", "flag": 3, "born_ts": 99, "born_host": "1.2.3.4:5", "sys_flag": rp.COMPRESSED_FLAG,
                    "tags": "TagA", "keys": ["k1", "k2"], "unique_id": "U1", "properties": {"DELAY": "2", "user": "x"}}
    (m,) = build_messages("T", 0, [item], store_ts=1, max_size=100, new_unique_id=lambda: "N",
                          default_born_host="", queue_ids_max=1)
    assert m.sys_flag == rp.COMPRESSED_FLAG and m.keys == ("k1", "k2") and m.unique_id == "U1"
    assert messages.message_in(b"b", 0, 0, {}, 1, "h") == {"body": b"b", "flag": 0, "born_ts": 1, "born_host": "h"}
    assert messages.is_half(0, {rp.TRAN_MSG: "true"}) and messages.is_half(rp.TRANSACTION_PREPARED_TYPE, {})
    assert not messages.is_half(rp.TRANSACTION_COMMIT_TYPE, {})


# -- the records' sys_flag ------------------------------------------------------------------------------------
def test_sys_flag_is_kept_in_the_record_and_absent_when_zero() -> None:
    plain = encode_message(stored())
    header = msgpack.unpackb(plain[5:5 + int.from_bytes(plain[1:5], "little")])
    assert len(header) == 11  # byte for byte what releases before sys_flag wrote
    flagged = encode_message(stored(sys_flag=rp.COMPRESSED_FLAG))
    assert decode_message(flagged).sys_flag == rp.COMPRESSED_FLAG and decode_message(plain).sys_flag == 0


def test_admission_never_looks_at_sys_flag() -> None:
    """Replicas of releases before the field and after it must admit the same records: a 12th element of any
    value changes nothing admission decides (and reads as 0 when it is no flag of ours)."""
    for extra in (1, -1, "x", None, 2**40, True):
        h = [*stored()[:10], 4, extra]
        packed = msgpack.packb(h, use_bin_type=True)
        record = MESSAGE_MAGIC + len(packed).to_bytes(4, "little") + packed + b"body"
        record += zlib.crc32(record).to_bytes(4, "little")
        assert admit_message(record)[1] is None
        assert decode_message(record).sys_flag == (1 if extra == 1 and extra is not True else 0)


def test_only_the_body_describing_bits_are_taken_from_a_producer() -> None:
    def build(flag: Any) -> StoredMessage:
        return build_messages("T", 0, [{"body": b"x", "sys_flag": flag}], store_ts=1, max_size=9,
                              new_unique_id=lambda: "N", default_born_host="", queue_ids_max=1)[0]

    assert build(rp.COMPRESSED_FLAG | rp.MULTI_TAGS_FLAG | rp.COMPRESSION_LZ4_TYPE).sys_flag == 0x103
    for bad in (rp.TRANSACTION_PREPARED_TYPE, rp.BORNHOST_V6_FLAG, -1, 2**31, "1", True):
        with pytest.raises(ProtocolError, match="sys_flag"):
            build(bad)


# -- errors -----------------------------------------------------------------------------------------------------
def test_the_codes_the_clients_act_on() -> None:
    for code in ("NOT_LEADER", "NOT_READY", "APPEND_FAILED", "DISK_FULL", "SERVICE_UNAVAILABLE"):
        assert code_of(code, send=True) == R.SERVICE_NOT_AVAILABLE  # retried by the producer
    assert code_of("BUSY") == R.SYSTEM_BUSY and code_of("TOPIC_NOT_EXIST") == R.TOPIC_NOT_EXIST
    assert code_of("INVALID_PROPERTIES", send=True) == R.MESSAGE_ILLEGAL  # never retried
    assert code_of("INVALID_PROPERTIES") == R.SYSTEM_ERROR and code_of("NOT_SUBSCRIBED") == R.NO_PERMISSION
    mapped = command_error(ProtocolError("NOT_LEADER", "leader is n1", 409), send=True)
    assert (mapped.code, mapped.remark) == (R.SERVICE_NOT_AVAILABLE, "NOT_LEADER: leader is n1")
    assert command_error(AuthError(403, "NO_PERMISSION", "no PUB on T"), send=True).code == R.NO_PERMISSION
    # every other handler's coded errors: answered by the remoting server with the edge's table
    server = RemotingServer(response_codes=CODES)
    assert response_code(ProtocolError("NOT_LEADER", "x", 409), server.response_codes) == R.SERVICE_NOT_AVAILABLE
    assert response_code(ProtocolError("SHUTTING_DOWN", "x", 503), server.response_codes) == R.SYSTEM_BUSY
    assert response_code(ProtocolError("INVALID_TOPIC", "x", 400), server.response_codes) == R.SYSTEM_ERROR
    assert response_code(ProtocolError("NOT_LEADER", "x", 409)) == R.SYSTEM_ERROR  # the NameServer's table


# -- channels ---------------------------------------------------------------------------------------------------
class FakeConn:
    closed = False


def channel(cid: str, conn: Any, **kw: Any) -> Channel:
    return Channel(client_id=cid, connection=conn, language=0, version=409, owner="*", client_addr="a:1", **kw)


def test_a_client_is_bound_to_the_connection_of_its_last_heartbeat() -> None:
    table = ClientChannels()
    a: Any = FakeConn()
    b: Any = FakeConn()
    table.bind(channel("c1", a, producer_groups=frozenset({"pg"})))
    table.bind(channel("c2", a, consumer_groups=frozenset({"cg"})))
    table.bind(channel("c1", b, producer_groups=frozenset({"pg"})))  # moved to b
    assert [c.client_id for c in table.drop_connection(a)] == ["c2"] and len(table) == 1
    assert [c.client_id for c in table.producers("pg")] == ["c1"]
    table.forget_producer("c1", "pg")
    assert len(table) == 0 and table.drop_connection(b) == []
    for i in range(CLIENTS_PER_CONNECTION_MAX):
        table.bind(channel(f"x{i}", a))
    with pytest.raises(TooManyClients):
        table.bind(channel("one-more", a))


# -- membership and locks ------------------------------------------------------------------------------------
def test_heartbeats_answer_which_groups_changed_and_keep_subscriptions() -> None:
    cm = ConsumerManager(expiry_ms=1000)
    sql = Subscription("SQL92", "a > 1")
    assert cm.heartbeat("c1", [("g", "CLUSTERING", ("T", "U"))], 0, filters={"g": {"T": sql}}) == {"g"}
    assert cm.heartbeat("c1", [("g", "CLUSTERING", ("T", "U"))], 10, filters={"g": {"T": sql}}) == set()
    assert cm.subscription("g", "T", 20) == sql and cm.subscription("g", "U", 20) == Subscription("TAG", "*")
    assert cm.subscription("g", "V", 20) is None
    assert cm.heartbeat("c2", [("g", "CLUSTERING", ("T",))], 30) == {"g"}
    assert cm.subscription("g", "T", 40) == Subscription("TAG", "*")  # the latest heartbeat's
    assert cm.heartbeat("c2", [("h", "CLUSTERING", ("T",))], 50) == {"g", "h"}
    assert cm.leave("c1", "g") == {"g"} and cm.leave("c1", "g") == set()


def test_queue_locks_renew_expire_and_stay_bounded() -> None:
    locks = QueueLocks()
    assert locks.lock("g", "A", [("T", 0), ("T", 1)], 0) == [("T", 0), ("T", 1)]
    assert locks.lock("g", "B", [("T", 0)], LOCK_EXPIRY_MS) == []  # A's lock is live for 60 s
    assert locks.lock("g", "A", [("T", 0)], LOCK_EXPIRY_MS) == [("T", 0)]  # renewed
    assert locks.lock("g", "B", [("T", 1)], LOCK_EXPIRY_MS + 1) == [("T", 1)]  # A's lock of queue 1 expired
    assert locks.holder("g", ("T", 0), 2 * LOCK_EXPIRY_MS) == "A"
    assert locks.holder("g", ("T", 0), 2 * LOCK_EXPIRY_MS + 1) is None
    assert locks.unlock("g", "B", [("T", 0)]) == 0 and locks.unlock("g", "A", [("T", 0)]) == 1
    assert locks.count == 1
    assert locks.expire(10 * LOCK_EXPIRY_MS) == 1 and locks.count == 0
    many = QueueLocks()
    assert len(many.lock("g", "A", [("T", q) for q in range(MAX_LOCKS + 5)], 0)) == MAX_LOCKS
    assert many.lock("g", "A", [("U", 0)], LOCK_EXPIRY_MS + 1) == [("U", 0)]  # expired ones make room


def test_a_heartbeat_may_keep_its_client_longer_than_the_default() -> None:
    """RocketMQ's clients heartbeat every 30 s (our SDK every 10 s): with the broker's default 40 s expiry one
    late heartbeat would drop such a member and make its group rebalance; the edge keeps them 120 s."""
    cm = ConsumerManager(expiry_ms=40_000)
    cm.heartbeat("sdk", [("g", "CLUSTERING", ("T",))], 0)
    cm.heartbeat("java", [("g", "CLUSTERING", ("T",))], 0, expiry_ms=120_000)
    assert [m.client_id for m in cm.members("g", 100_000)] == ["java"]
    assert cm.subscription("g", "T", 110_000) == Subscription("TAG", "*")
    assert cm.members("g", 120_001) == [] and cm.subscription("g", "T", 120_001) is None
