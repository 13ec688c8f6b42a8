"""Micro-benchmark of the remoting codecs on the send/pull path (prints figures; not a test).

    nice -n 10 .venv/bin/python -m tests.broker.protocol.rocketmq.bench_codec [--rounds N]

Cases: a SEND_MESSAGE_V2 request as the Java client sends it (JSON header, 1 KiB body) and in the
ROCKETMQ encoding, through ``FrameDecoder`` + the send header + its properties; a PULL answer of
32 x 1 KiB messages encoded (stored layout + response header); the same answer decoded; a
SEND_BATCH_MESSAGE body of 32 x 1 KiB decoded; a client's HEART_BEAT body decoded and a route
answer (TopicRouteData) encoded (the 4.9.8 vectors' texts). Best of ``--rounds`` runs, microseconds of CPU time
(``time.process_time``) per item: on a shared, loaded machine wall-clock figures mostly measure
the other jobs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from broker.protocol.rocketmq import bodies, command, headers, message, properties
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode, SerializeType

BODY = bytes(range(256)) * 4  # 1 KiB
PROPS = {"KEYS": "order-1", "UNIQ_KEY": "7F0000010001B4AAC2B50000000A", "WAIT": "true", "TAGS": "TagA"}


def send_frame(stype: SerializeType) -> bytes:
    h = headers.SendMessageRequestHeader(
        producer_group="please_rename_unique_group_name", topic="TopicTest", default_topic="TBW102",
        default_topic_queue_nums=4, queue_id=3, sys_flag=0, born_timestamp=1700000000123, flag=0,
        properties=properties.encode_properties(PROPS), reconsume_times=0, unit_mode=False, batch=False)
    ext = headers.send_header_to_ext_v2(h)
    ext.update({"AccessKey": "RocketMQ", "Signature": "+UexWYRJjJaojT/i91zri7grjPU="})
    return command.encode(command.request(RequestCode.SEND_MESSAGE_V2, 7, ext, BODY, serialize_type=stype))


def decode_send(frame: bytes) -> None:
    decoder = command.FrameDecoder()
    decoder.feed(frame)
    cmd = decoder.next()
    assert cmd is not None
    h = headers.parse_send_header(cmd.code, cmd.ext_fields)
    properties.decode_properties(h.properties or "")


def pull_messages(count: int) -> list[message.StoredMessage]:
    born, store = message.Host.parse("10.0.0.7:51234"), message.Host.parse("127.0.0.1:10911")
    return [message.StoredMessage(
        topic="TopicTest", body=BODY, queue_id=1, queue_offset=1000 + i, commit_log_offset=(1 << 30) + i * 1200,
        born_timestamp=1700000000000 + i, born_host=born, store_timestamp=1700000000100 + i, store_host=store,
        properties=PROPS, body_crc=12345) for i in range(count)]


def encode_pull(msgs: list[message.StoredMessage], stype: SerializeType) -> int:
    body = message.encode_stored_many(msgs)
    req = command.RemotingCommand(code=RequestCode.PULL_MESSAGE, opaque=9, serialize_type=stype)
    resp = command.response_to(req, ResponseCode.SUCCESS, None, headers.to_ext(headers.PullMessageResponseHeader(
        suggest_which_broker_id=0, next_begin_offset=1032, min_offset=0, max_offset=5000)))
    return len(command.encode_header(resp, len(body))) + len(body)


def best_us(fn: Callable[[], object], per_call: int, rounds: int, seconds: float = 0.3) -> float:
    calls = 1
    while True:  # calibrate: enough calls for ~seconds per round
        t = time.process_time()
        for _ in range(calls):
            fn()
        if time.process_time() - t > seconds / 4 or calls > 1 << 20:
            break
        calls *= 2
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - t) / calls)
    return best * 1e6 / per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    msgs = pull_messages(32)
    pull_body = message.encode_stored_many(msgs)
    batch = message.encode_batch([message.BatchItem(0, BODY, dict(PROPS)) for _ in range(32)])
    cases: list[tuple[str, Callable[[], object], int, str]] = []
    for stype in SerializeType:
        frame = send_frame(stype)
        cases.append((f"SEND_MESSAGE_V2 request decode ({stype.name}, {len(frame)} B frame)",
                      lambda f=frame: decode_send(f), 1, "frame"))
    for stype in SerializeType:
        cases.append((f"PULL answer encode, 32 x 1 KiB ({stype.name} header, {len(pull_body)} B body)",
                      lambda s=stype: encode_pull(msgs, s), 1, "answer"))
    cases.append(("  the same, per message", lambda: encode_pull(msgs, SerializeType.JSON), 32, "message"))
    cases.append(("PULL answer body decode, 32 x 1 KiB", lambda: message.decode_stored_many(pull_body), 32, "message"))
    cases.append(("SEND_BATCH_MESSAGE body decode, 32 x 1 KiB", lambda: message.decode_batch(batch), 32, "message"))
    from tests.broker.protocol.rocketmq.vectors import load

    heartbeat = load()["bodies"]["heartbeat"].encode()
    route = bodies.decode(bodies.TopicRouteData, load()["bodies"]["topic_route"].encode())
    cases.append((f"HEART_BEAT body decode ({len(heartbeat)} B, 3 subscriptions)",
                  lambda: bodies.decode(bodies.HeartbeatData, heartbeat), 1, "body"))
    cases.append(("TopicRouteData encode (1 broker group, 3 replicas)", lambda: bodies.encode(route), 1, "body"))
    print(f"best of {args.rounds} rounds, CPU time")
    for name, fn, per, unit in cases:
        print(f"{name:<72} {best_us(fn, per, args.rounds):8.2f} us/{unit}")


if __name__ == "__main__":
    main()
