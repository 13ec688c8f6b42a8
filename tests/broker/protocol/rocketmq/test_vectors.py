"""Our remoting codecs against bytes made by the official RocketMQ 4.9.8 classes, both ways: what
Java wrote decodes to what Java was given, and what we encode from that is Java's bytes again
(tests/wire/vectors/README.md says how the vectors are made)."""

from __future__ import annotations

import datetime

import pytest

from broker.protocol.rocketmq import acl, bodies, command, fastjson, headers, message, properties
from broker.protocol.rocketmq.codes import LanguageCode, ResponseCode, SerializeType
from tests.broker.protocol.rocketmq.vectors import load, pairs

FRAMES = load()["frames"]
MESSAGES = load()["messages"]


def test_the_vectors_are_4_9_8s() -> None:
    meta = load()["meta"]
    assert meta["rocketmq_version"] == "V4_9_8"
    assert meta["current_version"] == command.VERSION_V4_9_8
    assert meta["v4_9_3"] == command.VERSION_V4_9_3


# -- frames -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FRAMES))
def test_a_java_frame_decodes_to_what_java_was_given(name: str) -> None:
    vec = FRAMES[name]
    for key in ("hex", "encode_hex"):  # NettyEncoder's bytes and RemotingCommand.encode()'s
        cmd = command.decode(bytes.fromhex(vec[key]))
        assert cmd.code == vec["code"]
        assert LanguageCode(cmd.language).name == vec["language"]
        assert (cmd.version, cmd.opaque, cmd.flag) == (vec["version"], vec["opaque"], vec["flag"])
        assert cmd.serialize_type == SerializeType[vec["serialize_type"]]
        if vec["remark"] is None or "\ud800" not in vec["remark"]:  # a lone surrogate becomes "?"
            assert cmd.remark == vec["remark"]
        assert (cmd.ext_fields or {}) == pairs(vec["ext_fields"])
        assert cmd.body == bytes.fromhex(vec["body_hex"] or "")
        assert cmd.is_response == bool(vec["flag"] & 1)
        assert cmd.is_oneway == bool(vec["flag"] & 2)


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_we_encode_javas_bytes(name: str) -> None:
    vec = FRAMES[name]
    # commands without a custom header or added fields carry no extFields at all (JSON leaves it out)
    ext = None if name.startswith(("not_supported", "bare")) else pairs(vec["ext_fields"])
    remark = vec["remark"].replace("\ud800", "?") if vec["remark"] else vec["remark"]
    cmd = command.RemotingCommand(
        code=vec["code"], opaque=vec["opaque"], flag=vec["flag"], language=LanguageCode[vec["language"]],
        version=vec["version"], remark=remark, ext_fields=ext, body=bytes.fromhex(vec["body_hex"] or ""),
        serialize_type=SerializeType[vec["serialize_type"]],
    )
    assert command.encode(cmd).hex() == vec["encode_hex"]
    # the header alone (a writer sends the body apart)
    assert (command.encode_header(cmd) + cmd.body).hex() == vec["encode_hex"]


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_decode_then_encode_gives_nettys_bytes_back(name: str) -> None:
    """NettyEncoder's ROCKETMQ fast path writes a FastCodesHeader's fields before extFields, so a
    signed command holds each field twice; decoding keeps the last value, like Java's HashMap."""
    raw = bytes.fromhex(FRAMES[name]["hex"])
    again = command.encode(command.decode(raw))
    if name == "send_v2_signed_rocketmq":
        assert len(again) < len(raw)
        assert command.decode(again) == command.decode(raw)
    else:
        assert again == raw


def test_a_response_repeats_the_requests_opaque_and_header_type() -> None:
    req = command.decode(bytes.fromhex(FRAMES["send_v2_rocketmq"]["hex"]))
    resp = command.response_to(req, ResponseCode.SUCCESS, ext_fields={"msgId": "X"})
    assert (resp.opaque, resp.serialize_type) == (7, SerializeType.ROCKETMQ)
    assert (resp.is_response, resp.is_oneway) == (True, False)


# -- headers ----------------------------------------------------------------------------------------
def test_send_v2_and_v1_headers_read_alike_and_write_back() -> None:
    v2 = command.decode(bytes.fromhex(FRAMES["send_v2_json"]["hex"]))
    v1 = command.decode(bytes.fromhex(FRAMES["send_v1_json"]["hex"]))
    h2 = headers.parse_send_header(v2.code, v2.ext_fields)
    h1 = headers.parse_send_header(v1.code, v1.ext_fields)
    assert h1 == h2
    assert (h2.producer_group, h2.topic, h2.default_topic, h2.default_topic_queue_nums) == ("pg_vectors", "TopicTest",
                                                                                          "TBW102", 4)
    assert (h2.queue_id, h2.sys_flag, h2.born_timestamp, h2.flag, h2.reconsume_times) == (3, 0, 1700000000123, 0, 0)
    assert (h2.unit_mode, h2.batch, h2.max_reconsume_times, h2.broker_name) == (False, False, None, None)
    assert properties.decode_properties(h2.properties or "") == {
        "KEYS": "order-1", "UNIQ_KEY": "7F0000010001B4AAC2B5", "WAIT": "true", "TAGS": "TagA"}
    assert headers.send_header_to_ext_v2(h2) == v2.ext_fields
    assert headers.to_ext(h1) == v1.ext_fields


def test_pull_header_and_its_flags() -> None:
    cmd = command.decode(bytes.fromhex(FRAMES["pull_rocketmq"]["hex"]))
    h = headers.parse_request_header(cmd.code, cmd.ext_fields)
    assert isinstance(h, headers.PullMessageRequestHeader)
    assert (h.consumer_group, h.topic, h.queue_id, h.queue_offset, h.max_msg_nums) == ("cg_vectors", "TopicTest", 1,
                                                                                       42, 32)
    assert (h.commit_offset, h.suspend_timeout_millis, h.sub_version) == (40, 15000, 1700000000999)
    assert (h.subscription, h.expression_type) == ("TagA || TagB", "TAG")
    assert (h.commit_offset_flag, h.suspend, h.has_subscription, h.class_filter, h.lite_pull) == (
        True, True, True, False, False)
    assert headers.pull_sys_flag(commit_offset=True, suspend=True, subscription=True) == h.sys_flag
    assert headers.to_ext(h) == cmd.ext_fields


@pytest.mark.parametrize("name,cls", [
    ("send_response_json", headers.SendMessageResponseHeader),
    ("pull_response_rocketmq", headers.PullMessageResponseHeader),
    ("oneway_json", headers.UpdateConsumerOffsetRequestHeader),
])
def test_more_headers_round_trip(name: str, cls: type) -> None:
    cmd = command.decode(bytes.fromhex(FRAMES[name]["hex"]))
    h = headers.parse(cls, cmd.ext_fields)
    ext = dict(cmd.ext_fields or {})
    ext.pop("MSG_REGION", None)
    ext.pop("TRACE_ON", None)
    assert headers.to_ext(h) == ext


# -- messages ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["stored_v4_props", "stored_v4_no_props", "stored_v6_props", "stored_v4_txn",
                                  "stored_v4_zlib"])
def test_stored_messages_both_ways(name: str) -> None:
    vec = MESSAGES[name]
    raw = bytes.fromhex(vec["hex"])
    msg, end = message.decode_stored(raw)
    assert end == len(raw)
    assert msg.topic == vec["topic"]
    assert (msg.queue_id, msg.flag, msg.queue_offset, msg.commit_log_offset) == (
        vec["queue_id"], vec["flag"], vec["queue_offset"], vec["commit_log_offset"])
    assert (msg.sys_flag, msg.born_timestamp, msg.store_timestamp) == (
        vec["sys_flag"], vec["born_timestamp"], vec["store_timestamp"])
    assert msg.born_host.ip + msg.born_host.port.to_bytes(4, "big") == bytes.fromhex(vec["born_host"])
    assert msg.store_host.ip + msg.store_host.port.to_bytes(4, "big") == bytes.fromhex(vec["store_host"])
    assert (msg.reconsume_times, msg.prepared_transaction_offset) == (
        vec["reconsume_times"], vec["prepared_transaction_offset"])
    assert list(msg.properties.items()) == [tuple(p) for p in vec["properties"]]
    assert msg.body_crc == vec["body_crc"]
    assert message.decompress_body(msg.body, msg.sys_flag) == bytes.fromhex(vec["body_hex"])
    assert msg.offset_msg_id == vec["offset_msg_id"]
    assert message.encode_stored(msg) == raw
    # built from the fields alone (CRC computed when the body is not compressed)
    built = message.StoredMessage(
        topic=vec["topic"], body=msg.body, queue_id=vec["queue_id"], queue_offset=vec["queue_offset"],
        commit_log_offset=vec["commit_log_offset"], born_timestamp=vec["born_timestamp"], born_host=msg.born_host,
        store_timestamp=vec["store_timestamp"], store_host=msg.store_host, sys_flag=vec["sys_flag"], flag=vec["flag"],
        reconsume_times=vec["reconsume_times"], prepared_transaction_offset=vec["prepared_transaction_offset"],
        properties=pairs(vec["properties"]), body_crc=None if not vec["sys_flag"] & 1 else vec["body_crc"],
    )
    assert message.encode_stored(built) == raw


def test_the_zlib_body_is_javas_deflater_output() -> None:
    vec = MESSAGES["stored_v4_zlib"]
    msg, _ = message.decode_stored(bytes.fromhex(vec["hex"]))
    assert message.compress_body(bytes.fromhex(vec["body_hex"])) == msg.body


def test_batch_body_both_ways() -> None:
    vec = MESSAGES["batch"]
    raw = bytes.fromhex(vec["hex"])
    items = message.decode_batch(raw)
    assert [(i.flag, i.body.hex(), list(i.properties.items())) for i in items] == [
        (m["flag"], m["body_hex"], [tuple(p) for p in m["properties"]]) for m in vec["messages"]]
    assert [properties.encode_properties(i.properties) for i in items] == [
        m["properties_string"] for m in vec["messages"]]
    assert message.encode_batch(items) == raw


def test_message_ids() -> None:
    ids = MESSAGES["msg_ids"]
    assert message.make_offset_msg_id(message.Host.parse("192.168.1.20:10911"), 0x0102030405060708) == ids["v4"]
    assert message.make_offset_msg_id(message.Host.parse("[2001:db8::10]:10911"), 987654321) == ids["v6"]
    assert message.make_offset_msg_id(message.Host.parse("127.0.0.1:10911"), 8000) == ids["v4_socket"]
    assert message.parse_offset_msg_id(ids["v6"]) == (message.Host.parse("[2001:db8::10]:10911"), 987654321)
    assert message.parse_offset_msg_id(ids["v4"].lower()) == (message.Host.parse("192.168.1.20:10911"),
                                                              0x0102030405060708)


def test_java_string_hash() -> None:
    for text, code in load()["string_hash"].items():
        assert properties.java_string_hash(text) == code, text
    assert properties.tags_code(None) == properties.tags_code("") == 0
    assert properties.subscription_tags("TagA || TagB") == (("TagA", "TagB"), (2598919, 2598920))
    assert properties.subscription_tags("*") == ((), ())


# -- ACL --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(load()["acl"]))
def test_acl_signatures(name: str) -> None:
    vec = load()["acl"][name]
    ext = pairs(vec["ext_fields"])
    body = bytes.fromhex(vec["body_hex"]) if vec["body_hex"] else None
    assert acl.sign(ext, body, vec["secret_key"]) == vec["signature"]
    unsigned = {k: v for k, v in ext.items() if k not in (acl.ACCESS_KEY, acl.SIGNATURE, acl.SECURITY_TOKEN)}
    signed = acl.sign_request(unsigned, body, vec["access_key"], vec["secret_key"], vec["security_token"])
    assert signed == ext
    assert acl.verify(ext, body, vec["secret_key"], version=command.VERSION_V4_9_8)
    assert not acl.verify(ext, body, vec["secret_key"] + "x", version=command.VERSION_V4_9_8)
    assert not acl.verify(ext, (body or b"") + b"!", vec["secret_key"], version=command.VERSION_V4_9_8)
    tampered = dict(ext)
    tampered[next(k for k in ext if k != acl.SIGNATURE)] += "x"
    assert not acl.verify(tampered, body, vec["secret_key"], version=command.VERSION_V4_9_8)


def test_clients_up_to_4_9_3_signed_without_the_unique_key_flag() -> None:
    vec = load()["acl"]["binary_body"]  # carries _UNIQUE_KEY_QUERY, signed with it (a 4.9.8 client)
    ext, body = pairs(vec["ext_fields"]), bytes.fromhex(vec["body_hex"])
    assert acl.verify(ext, body, vec["secret_key"], version=command.VERSION_V4_9_3 + 1)
    assert not acl.verify(ext, body, vec["secret_key"], version=command.VERSION_V4_9_3)
    old = dict(ext)
    old[acl.SIGNATURE] = acl.sign({k: v for k, v in ext.items() if k != headers.UNIQUE_MSG_QUERY_FLAG}, body,
                                  vec["secret_key"])
    assert acl.verify(old, body, vec["secret_key"], version=command.VERSION_V4_9_3)


# -- bodies -----------------------------------------------------------------------------------------
BODY_TYPES: dict[str, type] = {
    "topic_route": bodies.TopicRouteData, "topic_route_order": bodies.TopicRouteData,
    "cluster_info": bodies.ClusterInfo, "heartbeat": bodies.HeartbeatData,
    "lock_batch_request": bodies.LockBatchRequestBody, "lock_batch_response": bodies.LockBatchResponseBody,
    "unlock_batch_request": bodies.UnlockBatchRequestBody, "consumer_connection": bodies.ConsumerConnection,
    "producer_connection": bodies.ProducerConnection, "consume_stats": bodies.ConsumeStats,
    "consume_stats_empty": bodies.ConsumeStats, "consume_stats_big_tps": bodies.ConsumeStats,
    "topic_stats": bodies.TopicStatsTable, "kv_table": bodies.KVTable, "topic_list": bodies.TopicList,
    "topic_list_addr": bodies.TopicList, "group_list": bodies.GroupList,
    "subscription_group_config": bodies.SubscriptionGroupConfig, "topic_config": bodies.TopicConfig,
    "topic_config_wrapper": bodies.TopicConfigSerializeWrapper,
    "subscription_group_wrapper": bodies.SubscriptionGroupWrapper,
    "consume_time_span": bodies.QueryConsumeTimeSpanBody, "reset_offset": bodies.ResetOffsetBody,
    "consumer_list": bodies.GetConsumerListByGroupResponseBody, "check_client": bodies.CheckClientRequestBody,
}


def test_every_body_vector_is_covered() -> None:
    assert set(BODY_TYPES) == set(load()["bodies"])


@pytest.mark.parametrize("name", sorted(BODY_TYPES))
def test_bodies_both_ways(name: str) -> None:
    text = load()["bodies"][name]
    obj = bodies.decode(BODY_TYPES[name], text.encode())
    assert bodies.encode(obj) == text.encode()


def test_bodies_built_from_fields_are_fastjsons_text() -> None:
    mq = [bodies.MessageQueue(topic="TopicTest", broker_name="RaftNode00", queue_id=i) for i in range(3)]
    stats = bodies.ConsumeStats(consume_tps=12.5, offset_table=tuple(
        (mq[i], bodies.OffsetWrapper(broker_offset=100 + i, consumer_offset=90 + i, last_timestamp=1700000000000 + i))
        for i in (1, 0, 2)))
    assert bodies.encode(stats).decode() == load()["bodies"]["consume_stats"]
    route = bodies.TopicRouteData(
        queue_datas=(bodies.QueueData(broker_name="RaftNode00", read_queue_nums=8, write_queue_nums=8, perm=6),),
        broker_datas=(bodies.BrokerData(cluster="DefaultCluster", broker_name="RaftNode00", broker_addrs={
            0: "127.0.0.1:10911", 1: "127.0.0.1:10921", 2: "127.0.0.1:10931"}),),
        filter_server_table={},
    )
    assert bodies.encode(route).decode() == load()["bodies"]["topic_route"]
    assert bodies.encode(route, standard_json=True).decode() == load()["bodies"]["topic_route"].replace(
        '{0:"', '{"0":"').replace(',1:"', ',"1":"').replace(',2:"', ',"2":"')
    span = bodies.QueueTimeSpan.of(mq[0], 1700000000000, 1700000009000, 1700000005000, 4000, datetime.UTC)
    assert bodies.encode(bodies.QueryConsumeTimeSpanBody(consume_time_span_set=(span,))).decode() == \
        load()["bodies"]["consume_time_span"]


def test_fastjson_string_escapes() -> None:
    table = {code: text for code, text in load()["fastjson_escapes"]}
    for code in range(0x10000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        assert fastjson.quote(chr(code)) == table.get(code, f'"{chr(code)}"'), hex(code)
