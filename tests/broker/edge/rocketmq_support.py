"""What the edge tests of transactions, queries and mqadmin's codes share: a cluster fixture, remoting clients
and requests built the way the official clients build them (with our codecs)."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from broker.protocol.auth import Credentials
from broker.protocol.rocketmq import bodies, headers
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.protocol.rocketmq.message import StoredMessage, decode_stored_many, parse_offset_msg_id
from tests.acl_fixtures import ADMIN
from tests.broker.inproc_cluster import InProcBrokerCluster, Replica
from tests.broker.serving.rmq_client import RmqClient

_UIDS = itertools.count(1)


def new_uid() -> str:
    """A UNIQ_KEY as the Java client makes them (32 upper-case hex digits)."""
    return f"{0xC0A80001:08X}{int(time.time() * 1000) & 0xFFFFFFFF:08X}{next(_UIDS):016X}"


@contextlib.asynccontextmanager
async def client(replica: Replica | str, creds: Credentials | None = ADMIN) -> AsyncIterator[RmqClient]:
    """A remoting connection to a replica's listenPort (signed with ``creds``; None: unsigned)."""
    addr = replica if isinstance(replica, str) else replica.addr
    c = await RmqClient.connect(addr, credentials=(creds.access_key, creds.secret_key) if creds else None)
    try:
        yield c
    finally:
        await c.close()


def send_ext(topic: str, queue_id: int, props: Mapping[str, str], *, group: str = "pg", sys_flag: int = 0
             ) -> dict[str, str]:
    header = headers.SendMessageRequestHeader(
        producer_group=group, topic=topic, default_topic="TBW102", default_topic_queue_nums=4, queue_id=queue_id,
        sys_flag=sys_flag, born_timestamp=int(time.time() * 1000), flag=0, properties=rp.encode_properties(props),
        reconsume_times=0, unit_mode=False, batch=False,
    )
    return headers.send_header_to_ext_v2(header)


async def send(c: RmqClient, topic: str, queue_id: int, body: bytes, *, keys: str | None = None,
               tags: str | None = None, uid: str | None = None, group: str = "pg", half: bool = False,
               extra: Mapping[str, str] | None = None) -> RemotingCommand:
    """SEND_MESSAGE_V2 as the Java clients send it; ``half``: a transaction's half (sysFlag 4,
    TRAN_MSG, PGROUP)."""
    props: dict[str, str] = {rp.UNIQ_KEY: uid or new_uid(), "WAIT": "true"}
    if keys:
        props[rp.KEYS] = keys
    if tags:
        props[rp.TAGS] = tags
    if half:
        props.update({rp.TRAN_MSG: "true", "PGROUP": group})
    props.update(extra or {})
    sys_flag = rp.TRANSACTION_PREPARED_TYPE if half else 0
    return await c.call(RequestCode.SEND_MESSAGE_V2, send_ext(topic, queue_id, props, group=group,
                                                               sys_flag=sys_flag), body)


def ok(cmd: RemotingCommand) -> RemotingCommand:
    assert cmd.code == ResponseCode.SUCCESS, f"{cmd.code} {cmd.remark}"
    return cmd


def refused(cmd: RemotingCommand, code: int = ResponseCode.NO_PERMISSION) -> RemotingCommand:
    assert cmd.code == code, f"expected {code}, got {cmd.code} {cmd.remark}"
    return cmd


def position_of(send_answer: RemotingCommand) -> int:
    """The commit-log offset in the offset msg id a send answered."""
    return parse_offset_msg_id((send_answer.ext_fields or {})["msgId"])[1]


def stored(cmd: RemotingCommand) -> list[StoredMessage]:
    return decode_stored_many(cmd.body)


async def max_offset(c: RmqClient, topic: str, queue_id: int) -> int:
    got = ok(await c.call(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)}))
    return int((got.ext_fields or {})["offset"])


async def heartbeat(c: RmqClient, client_id: str, *, producers: tuple[str, ...] = (),
                    consumers: tuple[bodies.ConsumerData, ...] = ()) -> RemotingCommand:
    beat = bodies.HeartbeatData(client_id=client_id,
                                producer_data_set=tuple(bodies.ProducerData(group_name=g) for g in producers),
                                consumer_data_set=consumers)
    return await c.call(RequestCode.HEART_BEAT, None, bodies.encode(beat))


def consumer(group: str, *topics: str, expression: str = "*", model: str = "CLUSTERING") -> bodies.ConsumerData:
    tags, codes = rp.subscription_tags(expression)
    return bodies.ConsumerData(
        group_name=group, consume_type="CONSUME_PASSIVELY", message_model=model,
        consume_from_where="CONSUME_FROM_FIRST_OFFSET",
        subscription_data_set=tuple(bodies.SubscriptionData(topic=t, sub_string=expression, tags_set=tags,
                                                            code_set=codes, sub_version=1) for t in topics),
    )


async def start_cluster(root: str, **props: str) -> InProcBrokerCluster:
    return await InProcBrokerCluster.start(root, broker_props=dict(props))


def acl_on(cluster: InProcBrokerCluster) -> bool:
    return cluster.groups[0].replicas[0].broker.cfg.security.acl_file is not None


ACL_OFF = {"aclEnable": "false"}  # the brokers' remoting without ACL (the NameServers keep theirs)


def ext(cmd: RemotingCommand) -> dict[str, Any]:
    return dict(cmd.ext_fields or {})
