"""Decode RocketMQ remoting frames from a loopback packet capture: how tests/wire/NOTES.md was written.

    tcpdump -i lo -s 0 -U -w cap.pcap 'tcp and (port 19876 or portrange 20909-20932)'   # while a client runs
    python tests/wire/remoting_dump.py cap.pcap --ports 19876,20909,20911,20919,20921,20929,20931 [--json]

Reassembles each TCP stream (pcap with Ethernet or Linux-cooked link layer, IPv4/IPv6), splits it into
frames (int32 length, int32 serialize type << 24 | header length, header, body), decodes JSON and ROCKETMQ
(binary) headers, and prints one line per frame in capture order: time, connection, direction, request or
response, code, opaque, flags, version, language, serialize type, extFields, remark, and the body (JSON text
when it is printable, else its length and first bytes in hex). Standard library only; bounded (frames over
16 MiB end the stream's decoding)."""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_FRAME = 16 << 20

# Names of the request codes (RequestCode.java, 4.9.8 and 5.3.1 agree on these), for readable output.
REQUEST_CODES = {
    10: "SEND_MESSAGE", 11: "PULL_MESSAGE", 12: "QUERY_MESSAGE", 14: "QUERY_CONSUMER_OFFSET",
    15: "UPDATE_CONSUMER_OFFSET", 17: "UPDATE_AND_CREATE_TOPIC", 21: "GET_ALL_TOPIC_CONFIG",
    25: "UPDATE_BROKER_CONFIG", 26: "GET_BROKER_CONFIG", 28: "GET_BROKER_RUNTIME_INFO",
    29: "SEARCH_OFFSET_BY_TIMESTAMP", 30: "GET_MAX_OFFSET", 31: "GET_MIN_OFFSET", 32: "GET_EARLIEST_MSG_STORETIME",
    33: "VIEW_MESSAGE_BY_ID", 34: "HEART_BEAT", 35: "UNREGISTER_CLIENT", 36: "CONSUMER_SEND_MSG_BACK",
    37: "END_TRANSACTION", 38: "GET_CONSUMER_LIST_BY_GROUP", 39: "CHECK_TRANSACTION_STATE",
    40: "NOTIFY_CONSUMER_IDS_CHANGED", 41: "LOCK_BATCH_MQ", 42: "UNLOCK_BATCH_MQ", 43: "GET_ALL_CONSUMER_OFFSET",
    45: "GET_ALL_DELAY_OFFSET", 46: "CHECK_CLIENT_CONFIG", 100: "PUT_KV_CONFIG", 101: "GET_KV_CONFIG",
    102: "DELETE_KV_CONFIG", 103: "REGISTER_BROKER", 104: "UNREGISTER_BROKER", 105: "GET_ROUTEINFO_BY_TOPIC",
    106: "GET_BROKER_CLUSTER_INFO", 200: "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP",
    201: "GET_ALL_SUBSCRIPTIONGROUP_CONFIG", 202: "GET_TOPIC_STATS_INFO", 203: "GET_CONSUMER_CONNECTION_LIST",
    204: "GET_PRODUCER_CONNECTION_LIST", 205: "WIPE_WRITE_PERM_OF_BROKER",
    206: "GET_ALL_TOPIC_LIST_FROM_NAMESERVER", 207: "DELETE_SUBSCRIPTIONGROUP", 208: "GET_CONSUME_STATS",
    215: "DELETE_TOPIC_IN_BROKER", 216: "DELETE_TOPIC_IN_NAMESRV", 219: "GET_KVLIST_BY_NAMESPACE",
    220: "RESET_CONSUMER_CLIENT_OFFSET", 221: "GET_CONSUMER_STATUS_FROM_CLIENT",
    222: "INVOKE_BROKER_TO_RESET_OFFSET", 223: "INVOKE_BROKER_TO_GET_CONSUMER_STATUS", 224: "GET_TOPICS_BY_CLUSTER",
    300: "QUERY_TOPIC_CONSUME_BY_WHO", 303: "QUERY_CONSUME_TIME_SPAN", 304: "GET_SYSTEM_TOPIC_LIST_FROM_NS",
    307: "GET_CONSUMER_RUNNING_INFO", 308: "QUERY_CORRECTION_OFFSET", 309: "CONSUME_MESSAGE_DIRECTLY",
    310: "SEND_MESSAGE_V2", 311: "GET_UNIT_TOPIC_LIST", 314: "CLONE_GROUP_OFFSET", 315: "VIEW_BROKER_STATS_DATA",
    317: "GET_BROKER_CONSUME_STATS", 319: "GET_NAMESRV_CONFIG", 320: "SEND_BATCH_MESSAGE",
    321: "QUERY_CONSUME_QUEUE", 322: "QUERY_DATA_VERSION", 323: "RESUME_CHECK_HALF_MESSAGE",
    324: "SEND_REPLY_MESSAGE", 325: "SEND_REPLY_MESSAGE_V2", 326: "PUSH_REPLY_MESSAGE_TO_CLIENT",
    327: "ADD_WRITE_PERM_OF_BROKER", 343: "QUERY_TOPICS_BY_CONSUMER", 345: "QUERY_SUBSCRIPTION_BY_CONSUMER",
    351: "GET_TOPIC_CONFIG", 352: "GET_SUBSCRIPTIONGROUP_CONFIG", 361: "LITE_PULL_MESSAGE", 400: "QUERY_ASSIGNMENT",
    901: "GET_BROKER_MEMBER_GROUP",
}
FLAG_RESPONSE = 1
FLAG_ONEWAY = 2
LANGUAGES = ["JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS",
             "RUST"]


@dataclass
class Segment:
    ts: float
    src: tuple[str, int]
    dst: tuple[str, int]
    seq: int
    flags: int
    payload: bytes


def read_pcap(path: str) -> Iterator[Segment]:
    with open(path, "rb") as f:
        data = f.read()
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise SystemExit(f"{path}: not a pcap file (pcapng is not read; use tcpdump -w)")
    nanos = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    pos = 24
    while pos + 16 <= len(data):
        sec, frac, incl, _orig = struct.unpack(endian + "IIII", data[pos:pos + 16])
        pkt = data[pos + 16:pos + 16 + incl]
        pos += 16 + incl
        ts = sec + frac / (1e9 if nanos else 1e6)
        if linktype == 1:           # Ethernet
            if len(pkt) < 14:
                continue
            ethertype, ip = struct.unpack("!H", pkt[12:14])[0], pkt[14:]
        elif linktype == 113:       # Linux cooked (SLL)
            ethertype, ip = struct.unpack("!H", pkt[14:16])[0], pkt[16:]
        elif linktype == 276:       # Linux cooked v2
            ethertype, ip = struct.unpack("!H", pkt[0:2])[0], pkt[20:]
        else:
            raise SystemExit(f"link type {linktype} not supported")
        if ethertype == 0x0800 and len(ip) >= 20 and ip[9] == 6:
            ihl = (ip[0] & 0x0F) * 4
            total = struct.unpack("!H", ip[2:4])[0]
            src_ip, dst_ip = ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20]))
            tcp = ip[ihl:total]
        elif ethertype == 0x86DD and len(ip) >= 40 and ip[6] == 6:
            plen = struct.unpack("!H", ip[4:6])[0]
            src_ip, dst_ip = ip[8:24].hex(), ip[24:40].hex()
            tcp = ip[40:40 + plen]
        else:
            continue
        if len(tcp) < 20:
            continue
        sport, dport, seq = struct.unpack("!HHI", tcp[:8])
        off = (tcp[12] >> 4) * 4
        yield Segment(ts, (src_ip, sport), (dst_ip, dport), seq, tcp[13], tcp[off:])


@dataclass
class Stream:
    """One direction of one TCP connection, reassembled in sequence order."""

    next_seq: int | None = None
    pending: dict[int, bytes] = field(default_factory=dict)
    buf: bytearray = field(default_factory=bytearray)
    broken: bool = False

    def feed(self, seg: Segment) -> None:
        syn = seg.flags & 0x02
        if syn:
            self.next_seq = (seg.seq + 1) & 0xFFFFFFFF
            return
        if not seg.payload:
            return
        if self.next_seq is None:          # capture started mid-connection: take it from here
            self.next_seq = seg.seq
        self.pending[seg.seq] = seg.payload
        while self.next_seq in self.pending:
            chunk = self.pending.pop(self.next_seq)
            self.buf += chunk
            self.next_seq = (self.next_seq + len(chunk)) & 0xFFFFFFFF
        # retransmissions of data already taken
        for s in [s for s in self.pending if (self.next_seq - s) & 0xFFFFFFFF < 1 << 31 and s != self.next_seq]:
            del self.pending[s]


def decode_header(ser: int, raw: bytes) -> dict[str, Any]:
    if ser == 0:
        return dict(json.loads(raw.decode("utf-8")))
    # ROCKETMQ binary: code i16, language i8, version i16, opaque i32, flag i32, remark (i32 len), ext (i32 len)
    code, lang, version, opaque, flag = struct.unpack("!hbhii", raw[:13])
    p = 13
    (rlen,) = struct.unpack("!i", raw[p:p + 4])
    p += 4
    remark = raw[p:p + rlen].decode("utf-8", "replace") if rlen > 0 else None
    p += max(rlen, 0)
    (elen,) = struct.unpack("!i", raw[p:p + 4])
    p += 4
    ext: dict[str, str] = {}
    end = p + max(elen, 0)
    while p < end:
        (kl,) = struct.unpack("!h", raw[p:p + 2])
        k = raw[p + 2:p + 2 + kl].decode()
        p += 2 + kl
        (vl,) = struct.unpack("!i", raw[p:p + 4])
        v = raw[p + 4:p + 4 + vl].decode("utf-8", "replace")
        p += 4 + vl
        ext[k] = v
    lang_name = LANGUAGES[lang] if 0 <= lang < len(LANGUAGES) else lang
    return {"code": code, "language": lang_name, "version": version, "opaque": opaque, "flag": flag,
            "remark": remark, "extFields": ext}


def frames(stream: Stream) -> Iterator[tuple[int, dict[str, Any], bytes]]:
    while not stream.broken and len(stream.buf) >= 8:
        (length,) = struct.unpack("!i", stream.buf[:4])
        if length < 4 or length > MAX_FRAME:
            stream.broken = True
            return
        if len(stream.buf) < 4 + length:
            return
        (ori,) = struct.unpack("!i", stream.buf[4:8])
        ser, hlen = (ori >> 24) & 0xFF, ori & 0xFFFFFF
        header_raw = bytes(stream.buf[8:8 + hlen])
        body = bytes(stream.buf[8 + hlen:4 + length])
        del stream.buf[:4 + length]
        try:
            header = decode_header(ser, header_raw)
        except (ValueError, struct.error, UnicodeDecodeError) as e:
            header = {"undecodable": str(e), "raw": header_raw[:64].hex()}
        yield ser, header, body


def describe_body(body: bytes, limit: int) -> Any:
    if not body:
        return None
    try:
        text = body.decode("utf-8")
        if text.isprintable() or all(c.isprintable() or c in "\r\n\t" for c in text):
            return text if len(text) <= limit else text[:limit] + f"...(+{len(text) - limit} chars)"
    except UnicodeDecodeError:
        pass
    return f"<{len(body)} bytes: {body[:min(limit, 96)].hex()}...>"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pcap")
    ap.add_argument("--ports", required=True, help="server ports (NameServer, brokers, VIP channels), comma separated")
    ap.add_argument("--json", action="store_true", help="one JSON object per frame")
    ap.add_argument("--body", type=int, default=600, help="characters of each body to show")
    a = ap.parse_args()
    servers = {int(p) for p in a.ports.split(",")}
    streams: dict[tuple[Any, ...], Stream] = {}
    conn_ids: dict[tuple[Any, ...], int] = {}
    t0: float | None = None
    for seg in read_pcap(a.pcap):
        if seg.src[1] not in servers and seg.dst[1] not in servers:
            continue
        t0 = seg.ts if t0 is None else t0
        to_server = seg.dst[1] in servers
        client, server = (seg.src, seg.dst) if to_server else (seg.dst, seg.src)
        conn = (client, server)
        cid = conn_ids.setdefault(conn, len(conn_ids) + 1)
        st = streams.setdefault((conn, to_server), Stream())
        st.feed(seg)
        for ser, h, body in frames(st):
            flag = int(h.get("flag", 0) or 0)
            kind = "RESP" if flag & FLAG_RESPONSE else ("ONEWAY" if flag & FLAG_ONEWAY else "REQ")
            code = h.get("code")
            name = REQUEST_CODES.get(int(code or 0), "") if kind != "RESP" else ""
            rec = {
                "t": round(seg.ts - t0, 4), "conn": cid, "client_port": client[1], "server_port": server[1],
                "dir": "c>s" if to_server else "s>c", "kind": kind, "code": code, "name": name,
                "opaque": h.get("opaque"), "flag": flag, "version": h.get("version"), "language": h.get("language"),
                "serialize": {0: "JSON", 1: "ROCKETMQ"}.get(ser, ser), "ext": h.get("extFields") or {},
                "remark": h.get("remark"), "body_len": len(body), "body": describe_body(body, a.body),
            }
            if "serializeTypeCurrentRPC" in h:
                rec["serializeTypeCurrentRPC"] = h["serializeTypeCurrentRPC"]
            if a.json:
                print(json.dumps(rec, ensure_ascii=False))
            else:
                ext = " ".join(f"{k}={v}" for k, v in sorted(rec["ext"].items()))
                print(f"{rec['t']:9.4f} #{cid} {client[1]}->{server[1]} {rec['dir']} {kind:6} code={code} {name} "
                      f"op={rec['opaque']} v={rec['version']} {rec['language']} {rec['serialize']} "
                      f"remark={rec['remark']!r} ext[{ext}] body({len(body)})={rec['body']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
