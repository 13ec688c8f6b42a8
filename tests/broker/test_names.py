"""Finding 3 of issue 10: one strict (full-match) name rule for the broker, the NameServer and the SDK.

``re.match`` with a pattern ending in ``$`` accepts a trailing newline: ``"Evil\\n"`` was accepted as a
topic by the broker, replicated, and then refused by the NameServer in every registration of the group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from broker.client.admin_checks import check_name
from broker.client.admin_records import InvalidArgument
from broker.client.message import Message, check_group, check_message
from broker.client.transport import ClientError
from broker.protocol import names
from broker.protocol.errors import ProtocolError
from broker.store.consume_queue import ConsumeQueueStore
from broker.store.message import check_group as broker_check_group
from broker.store.message import check_topic, check_unique_id, parse_msg_id
from namesrv.route_table import InvalidRecordError, validate_name, validate_topic

TRAILING = ["\n", "\r\n", "\x00", " "]
RULES: list[tuple[Callable[[object], bool], str]] = [
    (names.is_topic, "TopicA"),
    (names.is_group, "group_a"),
    (names.is_name, "RaftNode00"),
    (names.is_unique_id, "ABC123"),
    (names.is_property_name, "p.k"),
    (names.is_client_id, "10.0.0.1@1234"),
    (names.is_access_key, "admin"),
    (names.is_hex16, "00000000000000FF"),
    (names.is_decimal, "42"),
]


@pytest.mark.parametrize(("rule", "good"), RULES)
def test_every_rule_is_a_full_match(rule: Callable[[object], bool], good: str) -> None:
    assert rule(good)
    for tail in TRAILING:
        assert not rule(good + tail), repr(good + tail)
        assert not rule(tail + good), repr(tail + good)
    assert not rule("")
    assert not rule(None)
    assert not rule(7)


def test_decimal_refuses_unicode_digits() -> None:
    for s in ("²", "١", "1²", "٣٤", "1_000", "-1", "+1"):
        assert not names.is_decimal(s), s


@pytest.mark.parametrize("tail", TRAILING)
def test_broker_namesrv_and_sdk_agree(tail: str, tmp_path: Any) -> None:
    bad = "Evil" + tail
    with pytest.raises(ProtocolError):
        check_topic(bad)
    with pytest.raises(ProtocolError):
        broker_check_group(bad)
    with pytest.raises(ProtocolError):
        check_unique_id("U1" + tail)
    with pytest.raises(ProtocolError):
        parse_msg_id("RaftNode00" + tail + ":00000000000000FF")
    with pytest.raises(InvalidRecordError):
        validate_topic(bad)
    with pytest.raises(InvalidRecordError):
        validate_name(bad, "INVALID_BROKER_NAME", "broker_name")
    with pytest.raises(ClientError):
        check_message(Message(bad, b"x"))
    with pytest.raises(ClientError):
        check_group(bad)
    with pytest.raises(InvalidArgument):
        check_name(bad, "cluster")
    queues = ConsumeQueueStore(str(tmp_path))
    with pytest.raises(ValueError):
        queues.get_or_create(bad, 0)


def test_a_group_is_at_most_120_characters_so_its_retry_topic_is_a_topic() -> None:
    """Issue 23: groups of 121..255 characters were allowed, and ``%RETRY%``/``%DLQ%`` + group made a
    topic no replica could apply. RocketMQ limits groups to 120 for the same reason."""
    assert names.GROUP_CHARS_MAX == 120 and names.is_group("g" * 120) and names.is_topic("%RETRY%" + "g" * 120)
    assert not names.is_topic("%RETRY%" + "g" * 121)
    for bad in ("g" * 121, "g" * 255):
        assert not names.is_group(bad)
        with pytest.raises(ProtocolError, match="at most 120 characters"):
            broker_check_group(bad)
        with pytest.raises(ClientError):
            check_group(bad)  # the SDK refuses it before any request
    # what older releases stored: read or removed, never created
    assert names.is_stored_group("g" * 255) and not names.is_stored_group("g" * 256)
    assert names.is_stored_topic("%DLQ%" + "g" * 255) and names.is_stored_topic("%RETRY%" + "g" * 255)
    assert not names.is_stored_topic("%RETRY%" + "g" * 256) and not names.is_stored_topic("a/b")


def test_a_msg_id_names_a_broker_and_a_64_bit_position() -> None:
    assert parse_msg_id("RaftNode00:7FFFFFFFFFFFFFFF") == ("RaftNode00", 2**63 - 1)
    for bad in ("RaftNode00:8000000000000000", "RaftNode00:FFFFFFFFFFFFFFFF", "%RETRY%g:0000000000000001"):
        with pytest.raises(ProtocolError, match="msg id"):
            parse_msg_id(bad)
