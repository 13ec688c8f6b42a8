"""Requests of the official clients, built with our codecs (``broker.protocol.rocketmq``) the way the Java
4.9.8 client builds them (tests/wire/NOTES.md), for the broker edge's in-process tests."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from typing import Any

from broker.protocol.auth import Credentials
from broker.protocol.rocketmq import bodies, headers
from broker.protocol.rocketmq import message as rm
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.codes import RequestCode as C
from broker.protocol.rocketmq.command import RemotingCommand
from tests.broker.serving.rmq_client import RmqClient

_uids = itertools.count(1)


def uniq() -> str:
    """A Java-style UNIQ_KEY (32 upper-case hex digits)."""
    return f"0A000001{int(time.time()):08X}{next(_uids):016X}"


def send_header(topic: str, queue_id: int, props: Mapping[str, str] | None = None, *, group: str = "pg",
                sys_flag: int = 0, flag: int = 0, batch: bool = False) -> headers.SendMessageRequestHeader:
    return headers.SendMessageRequestHeader(
        producer_group=group, topic=topic, default_topic="TBW102", default_topic_queue_nums=4, queue_id=queue_id,
        sys_flag=sys_flag, born_timestamp=int(time.time() * 1000), flag=flag,
        properties=rp.encode_properties(props or {}), reconsume_times=0, unit_mode=False, batch=batch,
        broker_name="RaftNode00")


def msg_props(*, tags: str | None = None, keys: str | None = None, uid: str | None = None, **user: str
              ) -> dict[str, str]:
    props: dict[str, str] = {}
    if keys:
        props[rp.KEYS] = keys
    props[rp.UNIQ_KEY] = uid or uniq()
    props[rp.WAIT_STORE_MSG_OK] = "true"
    if tags:
        props[rp.TAGS] = tags
    props.update(user)
    return props


class Rmq:
    """One client connection to one broker replica."""

    def __init__(self, client: RmqClient):
        self.c = client

    @classmethod
    async def connect(cls, addr: str, creds: Credentials | None) -> Rmq:
        return cls(await RmqClient.connect(addr, credentials=(creds.access_key, creds.secret_key) if creds else None))

    async def close(self) -> None:
        await self.c.close()

    async def call(self, code: int, ext: Mapping[str, str] | None = None, body: bytes = b"",
                   **kw: Any) -> RemotingCommand:
        return await self.c.call(code, ext, body, **kw)

    async def send(self, topic: str, body: bytes, queue_id: int = 0, *, v1: bool = False,
                   **kw: Any) -> RemotingCommand:
        sys_flag = kw.pop("sys_flag", 0)
        h = send_header(topic, queue_id, msg_props(**kw), sys_flag=sys_flag)
        if v1:
            return await self.call(C.SEND_MESSAGE, headers.to_ext(h), body)
        return await self.call(C.SEND_MESSAGE_V2, headers.send_header_to_ext_v2(h), body)

    async def send_batch(self, topic: str, bodies_: list[bytes], queue_id: int = 0, *,
                         batch_uid: str | None = None, tags: str = "TagB") -> tuple[RemotingCommand, list[str]]:
        uids = [uniq() for _ in bodies_]
        items = [rm.BatchItem(0, b, {rp.UNIQ_KEY: u, rp.TAGS: tags, rp.KEYS: f"k-{i}"})
                 for i, (b, u) in enumerate(zip(bodies_, uids, strict=True))]
        props = {rp.WAIT_STORE_MSG_OK: "true", **({rp.UNIQ_KEY: batch_uid} if batch_uid else {})}
        h = send_header(topic, queue_id, props, batch=True)
        got = await self.call(C.SEND_BATCH_MESSAGE, headers.send_header_to_ext_v2(h), rm.encode_batch(items))
        return got, uids

    async def pull(self, topic: str, queue_id: int, offset: int, *, group: str = "cg", expression: str | None = "*",
                   kind: str = "TAG", suspend_ms: int = 0, max_nums: int = 32, commit_offset: int = -1,
                   timeout_s: float = 10.0) -> RemotingCommand:
        flag = headers.pull_sys_flag(commit_offset=commit_offset >= 0, suspend=suspend_ms > 0,
                                     subscription=expression is not None)
        h = headers.PullMessageRequestHeader(
            consumer_group=group, topic=topic, queue_id=queue_id, queue_offset=offset, max_msg_nums=max_nums,
            sys_flag=flag, commit_offset=max(commit_offset, 0), suspend_timeout_millis=suspend_ms, sub_version=0,
            subscription=expression, expression_type=kind if expression is not None else None)
        return await self.call(C.PULL_MESSAGE, headers.to_ext(h), timeout_s=timeout_s)

    async def heartbeat(self, client_id: str, groups: Mapping[str, Mapping[str, tuple[str, str]]], *,
                        producers: tuple[str, ...] = (), model: str = "CLUSTERING") -> RemotingCommand:
        """``groups``: group -> topic -> (expression type, expression)."""
        beat = bodies.HeartbeatData(
            client_id=client_id,
            producer_data_set=tuple(bodies.ProducerData(group_name=p) for p in producers),
            consumer_data_set=tuple(
                bodies.ConsumerData(group_name=g, consume_type="CONSUME_PASSIVELY", message_model=model,
                                    consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                    subscription_data_set=tuple(
                                        bodies.SubscriptionData(topic=t, sub_string=expr, expression_type=kind,
                                                                tags_set=rp.subscription_tags(expr)[0] if kind == "TAG"
                                                                else (),
                                                                code_set=rp.subscription_tags(expr)[1] if kind == "TAG"
                                                                else ())
                                        for t, (kind, expr) in subs.items()))
                for g, subs in groups.items()))
        return await self.call(C.HEART_BEAT, None, bodies.encode(beat))


def messages_of(cmd: RemotingCommand) -> list[rm.StoredMessage]:
    return rm.decode_stored_many(cmd.body)


def ext_int(cmd: RemotingCommand, name: str) -> int:
    assert cmd.ext_fields is not None, cmd
    return int(cmd.ext_fields[name])
