"""What the official RocketMQ 5.3.1 classes write (tests/wire/vectors/rmq5.json) reads right, and
what we write for 5.x is 5.3.1's bytes where the shapes agree. Where 5.x differs from 4.9.8: it ends
the properties string with a separator, its ``SubscriptionGroupConfig`` has more members (we write
4.9.8's, which 5.x clients read with defaults), and its fast ROCKETMQ encoder repeats fields."""

from __future__ import annotations

import pytest

from broker.protocol.rocketmq import acl, bodies, command, message, properties
from tests.broker.protocol.rocketmq.test_vectors import BODY_TYPES
from tests.broker.protocol.rocketmq.vectors import load5, pairs

V5 = load5()
MORE_MEMBERS_IN_5X = {"subscription_group_config", "subscription_group_wrapper"}


def test_the_vectors_are_5_3_1s() -> None:
    assert V5["meta"]["rocketmq_version"] == "V5_3_1"
    assert V5["meta"]["v4_9_3"] == command.VERSION_V4_9_3


@pytest.mark.parametrize("name", sorted(V5["frames"]))
def test_5x_frames(name: str) -> None:
    vec = V5["frames"][name]
    for key in ("hex", "encode_hex"):
        raw = bytes.fromhex(vec[key])
        cmd = command.decode(raw)
        assert (cmd.code, cmd.opaque) == (vec["code"], vec["opaque"])
        assert (cmd.flag, cmd.version) == (vec["flag"], vec["version"])
        assert (cmd.ext_fields or {}) == pairs(vec["ext_fields"])
        if name != "send_v2_signed_rocketmq" or key == "encode_hex":  # the fast encoder repeats fields
            assert command.encode(cmd) == raw


@pytest.mark.parametrize("name", sorted(BODY_TYPES))
def test_5x_bodies(name: str) -> None:
    text = V5["bodies"][name].encode()
    obj = bodies.decode(BODY_TYPES[name], text)
    if name not in MORE_MEMBERS_IN_5X:
        assert bodies.encode(obj) == text
    else:
        assert bodies.decode(BODY_TYPES[name], bodies.encode(obj)) == obj


@pytest.mark.parametrize("name", ["stored_v4_props", "stored_v4_no_props", "stored_v6_props", "stored_v4_txn",
                                  "stored_v4_zlib"])
def test_5x_stored_messages(name: str) -> None:
    vec = V5["messages"][name]
    raw = bytes.fromhex(vec["hex"])
    msg, _ = message.decode_stored(raw)
    assert list(msg.properties.items()) == [tuple(p) for p in vec["properties"]]
    assert msg.offset_msg_id == vec["offset_msg_id"]
    assert message.decompress_body(msg.body, msg.sys_flag) == bytes.fromhex(vec["body_hex"])
    props = properties.encode_properties(msg.properties, trailing_separator=True).encode()
    assert b"".join(message.stored_parts(msg, props)) == raw


def test_5x_batch_and_signatures() -> None:
    vec = V5["messages"]["batch"]
    items = message.decode_batch(bytes.fromhex(vec["hex"]))
    assert [properties.encode_properties(i.properties, trailing_separator=True) for i in items] == [
        m["properties_string"] for m in vec["messages"]]
    for sig in V5["acl"].values():
        body = bytes.fromhex(sig["body_hex"]) if sig["body_hex"] else None
        assert acl.sign(pairs(sig["ext_fields"]), body, sig["secret_key"]) == sig["signature"]
