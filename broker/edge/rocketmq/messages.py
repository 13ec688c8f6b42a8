"""Our stored messages in RocketMQ's layouts, and what a RocketMQ producer sends as our messages: the
pure conversions of the broker's RocketMQ edge (no I/O, no service calls).

A record of ours (``broker.store.message.StoredMessage``) as the stored layout ``MessageDecoder`` reads
(``broker.protocol.rocketmq.message``), field by field::

    queue id, flag, body, topic        the record's (the body as its producer sent it: compressed
                                       when ``sys_flag`` says so, which is kept with the record)
    queue offset                       the consume queue's (assigned when the record was applied)
    commit-log offset                  the record's log position (what our msg id names)
    sys flag                           the record's ``sys_flag`` (+ the host address kinds)
    born timestamp / born host         the record's ``born_ts`` / ``born_host`` (``ip:port`` of the
                                       producer's connection; 0.0.0.0:0 when it is no IP address)
    store timestamp                    the record's ``store_ts``
    store host                         the replica answering (its advertised ``host:listenPort``):
                                       every replica holds the same log, so each resolves the
                                       offset msg id it gives out (VIEW_MESSAGE_BY_ID)
    reconsume times                    property RECONSUME_TIME (set by our retries)
    prepared transaction offset        property __TXN_HALF_POS (a committed transaction's half)
    properties                         the record's properties + TAGS, KEYS (space separated) and
                                       UNIQ_KEY (the unique id: the client's message id);
                                       ORIGIN_MESSAGE_ID of ours (``group:position``) as an offset
                                       msg id of this store host

The other way (SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE): the properties string's TAGS,
KEYS and UNIQ_KEY become the message's tags, keys and unique id (so the de-duplication window makes
a retried send idempotent: the clients keep UNIQ_KEY across retries), WAIT is dropped (every send
waits for a majority), the rest are its properties; ``sysFlag``'s compression bits are kept, the
others (host kinds, transaction type) are not taken from a producer. The service validates every
value (``broker.store.message.build_messages``) before anything is appended.

Properties of a stored message must fit RocketMQ's 16-bit length: a record of ours whose properties
do not (our API allows more keys and property bytes) is served with its system properties only.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, Final

from broker.protocol.properties import PROP_HALF_POS, PROP_ORIGIN_MESSAGE_ID, PROP_RECONSUME_TIME
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.errors import RemotingError
from broker.protocol.rocketmq.message import Host, make_offset_msg_id, stored_parts
from broker.protocol.rocketmq.message import StoredMessage as WireMessage
from broker.store.message import StoredMessage, parse_msg_id

NO_HOST: Final = Host(b"\x00\x00\x00\x00", 0)
KEPT_SYS_FLAGS: Final = rp.COMPRESSED_FLAG | rp.MULTI_TAGS_FLAG | rp.COMPRESSION_TYPE_MASK
DROPPED_PROPERTIES: Final = frozenset({rp.TAGS, rp.KEYS, rp.UNIQ_KEY, rp.WAIT_STORE_MSG_OK})
_HOSTS_CACHED_MAX: Final = 4096
_INT64_MAX: Final = 2**63 - 1


# -- what a producer sends --------------------------------------------------------------------------
def message_in(body: bytes, flag: int, sys_flag: int, props: Mapping[str, str], born_ts: int,
               born_host: str) -> dict[str, Any]:
    """One message of a RocketMQ send as the service's ``MessageIn`` map (validated there)."""
    item: dict[str, Any] = {"body": body, "flag": flag, "born_ts": born_ts, "born_host": born_host}
    kept = sys_flag & KEPT_SYS_FLAGS
    if kept:
        item["sys_flag"] = kept
    tags = props.get(rp.TAGS)
    if tags:
        item["tags"] = tags
    keys = rp.keys_of(props)
    if keys:
        item["keys"] = keys
    uid = props.get(rp.UNIQ_KEY)
    if uid:
        item["unique_id"] = uid
    rest = {k: v for k, v in props.items() if k not in DROPPED_PROPERTIES}
    if rest:
        item["properties"] = rest
    return item


def is_half(sys_flag: int, props: Mapping[str, str]) -> bool:
    """A transaction's half message (prepared), as RocketMQ's broker tells it: ``TRAN_MSG=true``."""
    return props.get(rp.TRAN_MSG, "").lower() == "true" or rp.transaction_type(sys_flag) == rp.TRANSACTION_PREPARED_TYPE


# -- what a consumer reads --------------------------------------------------------------------------
class HostCache:
    """``ip:port`` strings (born hosts of records) as ``Host``s, parsed once each (bounded)."""

    def __init__(self) -> None:
        self._hosts: dict[str, Host] = {}

    def get(self, text: str) -> Host:
        host = self._hosts.get(text)
        if host is None:
            host = parse_host(text)
            if len(self._hosts) >= _HOSTS_CACHED_MAX:
                self._hosts.clear()
            self._hosts[text] = host
        return host


def parse_host(text: str) -> Host:
    """``ip:port`` (``[v6]:port``) as a ``Host``; anything else (a host name, our SDK's older
    ``born_host`` forms) as 0.0.0.0:0."""
    addr, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 0xFFFF:
        try:  # an address without a port
            return Host(ipaddress.ip_address(text.strip("[]")).packed, 0)
        except ValueError:
            return NO_HOST
    try:
        return Host(ipaddress.ip_address(addr.strip("[]")).packed, int(port))
    except ValueError:
        return NO_HOST


def _int_property(props: Mapping[str, str], name: str) -> int:
    value = props.get(name)
    if value is None:
        return 0
    try:
        number = int(value)
    except ValueError:
        return 0
    return number if 0 <= number <= _INT64_MAX else 0


def wire_properties(m: StoredMessage, broker_name: str, store_host: Host) -> dict[str, str]:
    """The properties a RocketMQ client reads for ``m``."""
    props = dict(m.properties)
    if m.tags:
        props[rp.TAGS] = m.tags
    if m.keys:
        props[rp.KEYS] = rp.KEY_SEPARATOR.join(m.keys)
    props[rp.UNIQ_KEY] = m.unique_id
    origin = props.get(PROP_ORIGIN_MESSAGE_ID)
    if origin is not None and ":" in origin:  # our msg id: as the offset msg id that finds it here
        try:
            name, position = parse_msg_id(origin)
        except Exception:
            name = ""
        if name == broker_name:
            props[PROP_ORIGIN_MESSAGE_ID] = make_offset_msg_id(store_host, position)
    return props


def encode_properties_text(props: Mapping[str, str]) -> bytes:
    return rp.encode_properties(props).encode("utf-8")


def _fitting_properties(m: StoredMessage, props: dict[str, str]) -> bytes:
    raw = encode_properties_text(props)
    if len(raw) <= rp.PROPERTIES_BYTES_MAX:
        return raw
    system = {k: v for k, v in props.items() if k in rp.SYSTEM_PROPERTIES and k != rp.KEYS}
    raw = encode_properties_text(system)
    if len(raw) <= rp.PROPERTIES_BYTES_MAX:
        return raw
    return encode_properties_text({rp.UNIQ_KEY: m.unique_id, **({rp.TAGS: m.tags} if m.tags else {})})


def stored_layout(m: StoredMessage, *, queue_offset: int, position: int, store_host: Host, broker_name: str,
                  hosts: HostCache) -> list[bytes]:
    """``m`` in the stored layout, as pieces to join (its body is not copied)."""
    props = wire_properties(m, broker_name, store_host)
    wire = WireMessage(
        topic=m.topic, body=m.body, queue_id=m.queue_id, queue_offset=queue_offset, commit_log_offset=position,
        born_timestamp=m.born_ts, born_host=hosts.get(m.born_host), store_timestamp=m.store_ts,
        store_host=store_host, sys_flag=m.sys_flag, flag=m.flag,
        reconsume_times=min(_int_property(props, PROP_RECONSUME_TIME), 2**31 - 1),
        prepared_transaction_offset=_int_property(props, PROP_HALF_POS),
    )
    return stored_parts(wire, _fitting_properties(m, props))


def offset_msg_id(store_host: Host, position: int) -> str:
    return make_offset_msg_id(store_host, position)


def store_host_of(address: str) -> Host:
    """The store host of ``host:port`` (an IP address; ``RemotingError`` BAD_FIELD otherwise)."""
    host = parse_host(address)
    if host is NO_HOST:
        raise RemotingError("BAD_FIELD", f"{address[:80]!r} is no ip:port")
    return host
