"""The replica files of synthetic runs (``synth``), written by the real writers.

A group's log is a list of ``Entry`` (term, body, messages): pysyncobj's no-op at every leader
change, ``topic.put``/``offset.commit``/``topic.delete`` command batches, and group-committed
batches of ``broker.store.message`` records. ``write_logs`` writes it with ``dledger.entry_store.EntryStore``
into every replica (optionally diverging one) and gives each message its log position;
``write_state`` applies the entries the way the broker's dispatcher does — consume queues with
``broker.store.consume_queue`` (a ``topic.delete`` destroys the topic's queues), the ``broker/snapshot``
record and the ``meta/`` files.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import struct
import zlib
from collections import defaultdict
from typing import Any

import msgpack

from broker.store.consume_queue import ConsumeQueueStore
from broker.store.message import StoredMessage, encode_command, encode_message, tag_hash
from dledger.command_codec import body_offsets, encode_batch
from dledger.entry_store import EntryStore

TOPIC = "ChaosTopic"
CONSUMER_GROUP = "chaos_consumer"
SCRATCH_TOPIC = "ScratchTopic"
NO_OP = b"\x01"  # pysyncobj's leader no-op body
TAGS = "TagA"


@dataclasses.dataclass(slots=True)
class Msg:
    uid: str
    topic: str
    group: str
    queue_id: int
    key: str | None
    producer: str | None
    seq: int | None
    born_ms: int
    store_ms: int
    record: bytes = b""
    index: int = 0
    position: int = 0
    offset: int = 0
    receipt_us: int = 0


Entry = tuple[int, bytes, list[Msg]]  # term, body, the messages in it ([] for no-ops and commands)
Queues = dict[tuple[str, int], list[Msg]]


def replica_dir(run_dir: str, group: str, node: str) -> str:
    return os.path.join(run_dir, "cluster", "data", group, f"dledger-{node}")


def body_of(uid: str) -> bytes:
    """The body of a synthetic message (what its send line's ``body_crc`` is the CRC-32 of)."""
    return (uid.encode() + b":payload:") * 2


def body_crc(uid: str) -> int:
    return zlib.crc32(body_of(uid))


def stored_message(m: Msg) -> StoredMessage:
    props = {} if m.producer is None else {"producer": m.producer, "seq": str(m.seq)}
    body = body_of(m.uid)
    keys = (m.key,) if m.key else ()
    return StoredMessage(
        m.topic, m.queue_id, 0, TAGS, keys, props, m.born_ms, "127.0.0.1:50000", m.store_ms, m.uid, body
    )


def _batch(msgs: list[Msg]) -> bytes:
    for m in msgs:
        m.record = encode_message(stored_message(m))
    return encode_batch([m.record for m in msgs])


def _command(cmd: dict[str, Any]) -> bytes:
    return encode_batch([encode_command(cmd)])


def build_entries(
    group: str,
    stream: list[Msg],
    term_changes_us: list[int],
    batch: int,
    queues: int,
    rng: random.Random,
    scratch: bool,
) -> list[Entry]:
    """The group's log: messages in stream (store) order, 1..``batch`` per entry, a term change
    and no-op at every leader change, an ``offset.commit`` of the workload's consumer group every
    500 messages (each queue's offset: its messages so far)."""
    term = 1
    changes = sorted(term_changes_us)
    put = {
        "op": "topic.put",
        "topic": TOPIC,
        "read_queue_nums": queues,
        "write_queue_nums": queues,
        "perm": 6,
    }
    entries: list[Entry] = [(term, NO_OP, []), (term, _command(put), [])]
    if scratch:
        entries += _scratch_entries(group, term, stream[0].store_ms if stream else 0)
    k = since_commit = 0
    per_queue: dict[int, int] = defaultdict(int)
    while k < len(stream):
        if changes and stream[k].store_ms * 1000 >= changes[0]:
            changes.pop(0)
            term += 1
            entries.append((term, NO_OP, []))
            continue
        msgs = stream[k : k + rng.randrange(1, batch + 1)]
        if changes:
            msgs = [m for m in msgs if m.store_ms * 1000 < changes[0]] or msgs[:1]
        k += len(msgs)
        entries.append((term, _batch(msgs), msgs))
        for m in msgs:
            if m.topic == TOPIC:
                per_queue[m.queue_id] += 1
        since_commit += len(msgs)
        if since_commit >= 500:
            since_commit = 0
            offsets = {str(q): n for q, n in sorted(per_queue.items())}
            cmd = {"op": "offset.commit", "group": CONSUMER_GROUP, "topic": TOPIC, "offsets": offsets}
            entries.append((term, _command(cmd), []))
    return entries


def _scratch_entries(group: str, term: int, store_ms: int) -> list[Entry]:
    """A topic that gets 5 messages, is deleted, and gets 3 more (its queue restarts at 0)."""
    out: list[Entry] = []
    for phase, count in ((0, 5), (1, 3)):
        if phase == 1:
            out.append((term, _command({"op": "topic.delete", "topic": SCRATCH_TOPIC}), []))
        msgs = [
            Msg(f"SCRATCH{phase}{k:026X}", SCRATCH_TOPIC, group, 0, None, None, None, store_ms, store_ms)
            for k in range(count)
        ]
        out.append((term, _batch(msgs), msgs))
    return out


def diverge_index(entries: list[Entry], at: float) -> int:
    """The index of the first entry holding messages from fraction ``at`` of the log on."""
    k = int(len(entries) * at)
    while not entries[k][2]:
        k += 1
    return k + 1


def write_logs(
    run_dir: str,
    group: str,
    nodes: list[str],
    entries: list[Entry],
    segment_bytes: int,
    diverge_body: tuple[str, int] | None = None,
    diverge_term: tuple[str, int] | None = None,
    chains_at: set[int] | None = None,
) -> dict[str, dict[int, int]]:
    """Every replica's log; ``diverge_body`` = (node, index): that node's entry holds a different
    last body byte there; ``diverge_term`` = (node, index): that node's terms are one higher from
    there on. Sets each message's index and position (all replicas lay entries out alike).
    Returns each node's chain CRC at the indexes ``chains_at``."""
    positions: list[int] = []
    chains: dict[str, dict[int, int]] = {}
    for node in nodes:
        rows = [(i + 1, term, body) for i, (term, body, _) in enumerate(entries)]
        if diverge_body is not None and node == diverge_body[0]:
            at = diverge_body[1]
            flipped = bytearray(rows[at - 1][2])
            flipped[-1] ^= 0xFF  # the last byte of the last record's body: headers still decode
            rows[at - 1] = (at, rows[at - 1][1], bytes(flipped))
        if diverge_term is not None and node == diverge_term[0]:
            rows = [(i, t + 1 if i >= diverge_term[1] else t, b) for i, t, b in rows]
        store = EntryStore(
            os.path.join(replica_dir(run_dir, group, node), "store"), segment_bytes=segment_bytes
        )
        try:
            got: list[int] = []
            for k in range(0, len(rows), 4096):
                got += store.append_many(rows[k : k + 4096])
            chains[node] = {i: store.chain_crc_at(i) for i in sorted(chains_at or ()) if 1 <= i <= len(rows)}
        finally:
            store.close()
        positions = positions or got
        assert got == positions, "replicas must lay entries out identically"
    for i, ((_, _body, msgs), pos) in enumerate(zip(entries, positions, strict=True)):
        base = pos + EntryStore.header_bytes
        for m, off in zip(msgs, body_offsets([m.record for m in msgs]), strict=True):
            m.index, m.position = i + 1, base + off
    return chains


def write_state(
    run_dir: str, group: str, nodes: list[str], entries: list[Entry], term: int, units_per_file: int
) -> Queues:
    """Consume queues, store snapshot and meta files of every replica (the same in each, as after a
    clean apply); sets each message's queue offset and returns the queues' messages."""
    first = replica_dir(run_dir, group, nodes[0])
    queues: Queues = defaultdict(list)
    cqs = ConsumeQueueStore(os.path.join(first, "broker", "consumequeue"), units_per_file)
    end = 0
    for _, body, msgs in entries:
        if not msgs and body[:1] == b"D" and b"topic.delete" in body:
            cqs.delete_topic(SCRATCH_TOPIC)
            queues.pop((SCRATCH_TOPIC, 0), None)
        for m in msgs:
            q = queues[(m.topic, m.queue_id)]
            m.offset = len(q)
            q.append(m)
            cqs.get_or_create(m.topic, m.queue_id).append(
                m.position, len(m.record), tag_hash(TAGS), m.store_ms
            )
            end = m.position + len(m.record)
    cqs.close()
    snap = {
        "version": 1,
        "applied_index": len(entries),
        "end_position": end,
        "metadata": {},
        "queues": [[t, q, len(ms)] for (t, q), ms in sorted(queues.items())],
        "needs_state_after": None,
    }
    for node in nodes:
        rdir = replica_dir(run_dir, group, node)
        if node != nodes[0]:
            shutil.copytree(os.path.join(first, "broker"), os.path.join(rdir, "broker"))
        write_snapshot(os.path.join(rdir, "broker", "snapshot"), snap)
        os.makedirs(os.path.join(rdir, "meta"), exist_ok=True)
        write_meta(os.path.join(rdir, "meta"), len(entries), term, nodes[0])
    return queues


def drop_unit(run_dir: str, group: str, node: str, key: tuple[str, int], msgs: list[Msg], upf: int) -> int:
    """Rewrite one queue of one replica without the unit of its last message (what a recovery that
    drops a queue's last unit leaves); returns the position that unit pointed at."""
    cqs = ConsumeQueueStore(os.path.join(replica_dir(run_dir, group, node), "broker", "consumequeue"), upf)
    drop = len(msgs) - 1
    cq = cqs.reset_queue(*key)
    for k, m in enumerate(msgs):
        if k != drop:
            cq.append(m.position, len(m.record), tag_hash(TAGS), m.store_ms)
    cqs.close()
    return msgs[drop].position


def tear(run_dir: str, group: str, node: str) -> None:
    """Half an entry header after the last entry: what a crash in the middle of an append leaves."""
    log_dir = os.path.join(replica_dir(run_dir, group, node), "store", "log")
    with open(os.path.join(log_dir, max(os.listdir(log_dir))), "ab") as f:
        f.write(struct.pack("<II", 0xD1ED6E01, 400) + bytes(13))


def write_snapshot(path: str, snap: dict[str, Any]) -> None:
    """``broker/snapshot`` as ``broker.store.message_store`` writes it: crc32 LE + msgpack."""
    payload = msgpack.packb(snap, use_bin_type=True)
    with open(path, "wb") as f:
        f.write(zlib.crc32(payload).to_bytes(4, "little") + payload)


def write_meta(meta_dir: str, commit: int, term: int, voted_for: str) -> None:
    """``meta/raft_commit`` and ``meta/raft_term`` as ``dledger.journal`` writes them."""
    with open(os.path.join(meta_dir, "raft_commit"), "wb") as f:
        f.write(struct.pack("<QI", commit, zlib.crc32(struct.pack("<Q", commit))))
    vote = voted_for.encode()
    payload = struct.pack("<QH", term, len(vote)) + vote
    with open(os.path.join(meta_dir, "raft_term"), "wb") as f:
        f.write(payload + struct.pack("<I", zlib.crc32(payload)))
