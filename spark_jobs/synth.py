"""Synthetic chaos run directories, with anomalies planted on purpose, for tests and benchmarks.

``python -m spark_jobs.synth RUN_DIR --events 1000000 [--plant lost=3,dup=5,...] [--seed 7]``

Writes what a chaos run leaves behind (docs/CHAOS.md): ``run.json``, ``faults.jsonl``,
``history/{sends-*,receipts-*,drain}.jsonl`` and, for every group, three replicas whose files are
written by the real writers — ``dledger.entry_store.EntryStore`` (segments, BLANK padding, chain
CRCs, anchor, index), ``dledger.command_codec`` batches of ``broker.store.message`` records,
``broker.store.consume_queue`` queues, the ``broker/snapshot`` record and the ``meta/`` files — plus
``synth.json``: the plan, listing every planted anomaly so tests can demand exact findings.

The workload: ``--producers`` closed-loop producers (a send starts 50 µs after the previous one
returns) with sharding keys; a key always maps to one queue; ``--events`` = sends + receipts (the
final drain of every queue comes on top). Each group's log holds its messages in store order,
group-committed into entries of 1..``--batch`` records, plus ``topic.put``/``offset.commit``
commands, a scratch topic that is deleted and re-created (``topic.delete`` in the log) and, at
every leader fault, a term change with pysyncobj's no-op entry.

Plants (``--plant kind=count,...``), each found by the audit as synth.json lists:
  lost          ok send whose message is in no replica's log, no receipt, no drain (lost)
  unconsumed    ok send in the log, never received nor drained, reads went past it (lost)
  unseen        ok send, the last of its queue, in the log but never received nor drained (unseen)
  dup           one extra receipt of a message (same consumer, right after the first)
  logdup        a second copy of an ok send in the log (a retried send; consumers get both)
  unexpected    a receipt of a message nobody sent
  qorder        a receipt moved after the next one of its queue and session (poll_order: skip,
                backwards, skip)
  skip          a receipt dropped from its session (poll_order: skip; the drain still has it)
  korder        two consecutive-seq messages of one producer's key swapped in the log (key_order; and
                send_order: the later send of that producer to that queue got the lower offset)
  ackoff        a producer's last ok send to a queue acknowledged with a wrong offset
                (ack_offset_mismatch)
  incons        a drain line names another message of its queue at its offset (inconsistent_offsets)
  aborted       an ok, stored send recorded as "fail" (aborted_read)
  corrupt       a receipt whose body CRC is not the one sent (corrupt_read)
  rewind        a consumer re-reads 5 offsets of a queue in a new session (redelivery after a
                rebalance: duplicates, no order finding)
  diverge_body  one replica (n2 of the last group) holds a different body from some index on
  diverge_chain one replica (n1 of the first group) holds a different term from some index on
                (the sampler then sees their chain CRCs differ: commit_crc_mismatch rows)
  cq            the last unit missing from a queue of replica n1 of the first group
  unavail       a 3 s stall: every producer's attempt times out, no ok send completes
  drainerr      run.json says the drain could not read a queue (drain_incomplete)
  prefix, crc, truncation, offset, election: the sampler's lines (see ``synth_samples``)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import zlib
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from broker.store.message import decode_command
from dledger.command_codec import decode_batch, is_batch
from spark_jobs import synth_replicas as R
from spark_jobs import synth_samples as SS
from spark_jobs.synth_replicas import TOPIC, Msg

T0_US = 1_700_000_000_000_000
PLANT_KINDS = (
    "lost",
    "unconsumed",
    "unseen",
    "dup",
    "logdup",
    "unexpected",
    "qorder",
    "skip",
    "korder",
    "ackoff",
    "incons",
    "aborted",
    "corrupt",
    "rewind",
    "diverge_body",
    "diverge_chain",
    "cq",
    "unavail",
    "drainerr",
    *SS.SAMPLE_PLANTS,
)
STALL_US = 3_000_000
REWIND_SPAN = 5


@dataclasses.dataclass(frozen=True)
class SynthConfig:
    events: int = 4000
    groups: int = 2
    replicas: int = 3
    producers: int = 4
    consumers: int = 2
    queues: int = 4  # per group
    keys: int = 8  # per producer
    batch: int = 8  # max records per entry
    fail_rate: float = 0.002
    unknown_rate: float = 0.002
    seed: int = 7
    segment_bytes: int = 64 << 20
    units_per_file: int = 300_000
    torn_tail: bool = False
    plants: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class Send:
    producer: str
    key: str
    seq: int
    uid: str
    invoke_us: int
    complete_us: int
    outcome: str = "ok"
    error: str | None = None
    stored: bool = True
    store_exact_us: int = 0
    msg: Msg | None = None  # the copy the ack describes
    ack_offset: int | None = None  # an ack that names another offset than the message's (ackoff)


def parse_plants(spec: str | None) -> dict[str, int]:
    plants: dict[str, int] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        kind, _, count = part.partition("=")
        kind = kind.strip()
        if kind not in PLANT_KINDS:
            raise ValueError(f"unknown plant {kind!r} (known: {', '.join(PLANT_KINDS)})")
        plants[kind] = int(count or "1")
    return plants


Lines = dict[str, list[dict[str, Any]]]  # history lines per consumer
PerQueue = dict[tuple[str, int], list[Msg]]  # (group, queue id) -> its messages in offset order
Owner = dict[tuple[str, int], str]  # (group, queue id) -> the consumer that reads it


def _fault(t: int, fault: str, action: str, targets: list[str], **detail: Any) -> dict[str, Any]:
    return {"time_us": t, "fault": fault, "action": action, "targets": targets, "detail": detail}


def _uid(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032X}"


class _Builder:
    def __init__(self, run_dir: str, cfg: SynthConfig):
        self.run_dir = run_dir
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.groups = [f"RaftNode{g:02d}" for g in range(cfg.groups)]
        self.nodes = [f"n{k}" for k in range(cfg.replicas)]
        self.queues = [(g, q) for g in self.groups for q in range(cfg.queues)]
        self.plan: dict[str, Any] = {k: [] for k in PLANT_KINDS}
        self.faults: list[dict[str, Any]] = []
        self.sends: list[Send] = []
        self.used: set[str] = set()  # uids some plant already touched
        self.streams: dict[str, list[Msg]] = {}
        self.commits: dict[str, int] = {}
        self.term_changes: list[int] = []  # fault apply times that change every group's leader
        self.queues_of: dict[str, R.Queues] = {}
        self.sample_groups: dict[str, dict[str, Any]] = {}

    # -- sends ---------------------------------------------------------------------------------
    def make_sends(self) -> None:
        cfg = self.cfg
        n_sends = max(1, cfg.events // 2)
        per_producer = [
            n_sends // cfg.producers + (p < n_sends % cfg.producers) for p in range(cfg.producers)
        ]
        stalls = self._plan_faults(duration_us=max(per_producer) * 1600)
        for p, count in enumerate(per_producer):
            self._producer(f"p{p}", count, stalls)
        self.sends.sort(key=lambda s: s.invoke_us)

    def _plan_faults(self, duration_us: int) -> list[int]:
        """Fault lines; returns the planted stalls' start times (a leader kill each)."""
        n = self.cfg.plants.get("unavail", 0)
        stalls = [T0_US + duration_us * (k + 1) // (n + 1) for k in range(n)]
        leaders = [f"{g}-n0" for g in self.groups]
        for t in stalls:
            self.plan["unavail"].append({"start_us": t, "end_us": t + STALL_US})
            self.faults += [
                _fault(t, "kill-leader", "apply", leaders),
                _fault(t + STALL_US // 2, "kill-leader", "heal", leaders),
            ]
            self.term_changes.append(t)
        for k in range(2):  # harmless faults (a latency toxic) in every run: recovery without an outage
            t = T0_US + int(duration_us * (k + 0.3) / 2)
            link = ["client->RaftNode00-n0"]
            self.faults += [
                _fault(t, "latency", "apply", link, latency_ms=1),
                _fault(t + 200_000, "latency", "heal", link),
            ]
        self.faults.sort(key=lambda f: f["time_us"])
        return stalls

    def _producer(self, name: str, count: int, stalls: list[int]) -> None:
        """One closed-loop producer: each send starts 50 µs after the previous one returned."""
        cfg, rng = self.cfg, self.rng
        keys = [f"{name}-k{j}" for j in range(cfg.keys)]
        seqs: dict[str, int] = defaultdict(int)
        t = T0_US + rng.randrange(0, 500)
        stall_k = 0
        for _ in range(count):
            key = keys[rng.randrange(len(keys))]
            s = Send(name, key, seqs[key], _uid(rng), t, 0)
            seqs[key] += 1
            if stall_k < len(stalls) and t >= stalls[stall_k]:
                # The stalled attempt: it times out when the stall ends; nothing is stored.
                s.complete_us = stalls[stall_k] + STALL_US + rng.randrange(0, 2000)
                s.outcome, s.error, s.stored = "unknown", "TIMEOUT", False
                stall_k += 1
            else:
                s.complete_us = t + rng.randrange(400, 3000)
                r = rng.random()
                if r < cfg.fail_rate:
                    s.outcome, s.error, s.stored = "fail", "SERVICE_NOT_AVAILABLE", False
                elif r < cfg.fail_rate + cfg.unknown_rate:
                    s.outcome, s.error, s.stored = "unknown", "TIMEOUT", rng.random() < 0.5
            s.store_exact_us = s.invoke_us + (s.complete_us - s.invoke_us) // 2
            self.sends.append(s)
            t = s.complete_us + 50

    def queue_of(self, key: str) -> tuple[str, int]:
        return self.queues[zlib.crc32(key.encode()) % len(self.queues)]

    # -- logs ----------------------------------------------------------------------------------
    def make_streams(self) -> None:
        by_group: dict[str, list[Msg]] = {g: [] for g in self.groups}
        stored = sorted((s for s in self.sends if s.stored), key=lambda s: s.store_exact_us)
        for s in stored:
            g, q = self.queue_of(s.key)
            m = Msg(
                s.uid, TOPIC, g, q, s.key, s.producer, s.seq, s.invoke_us // 1000, s.store_exact_us // 1000
            )
            s.msg = m
            by_group[g].append(m)
        self.streams = by_group
        ok_stored = [s for s in stored if s.outcome == "ok"]
        self._plant_lost(ok_stored)
        self._plant_logdup(ok_stored)
        self._plant_korder()

    def _pick(self, candidates: list[Send], n: int, kind: str) -> list[Send]:
        free = [s for s in candidates if s.uid not in self.used]
        if len(free) < n:
            raise ValueError(f"not enough messages to plant {n} x {kind}: use more --events")
        # Keep plants away from the first and last messages (boundaries are not what we test).
        lo, hi = len(free) // 10, len(free) - len(free) // 10
        picked = self.rng.sample(free[lo:hi] if hi - lo >= n else free, n)
        for s in picked:
            self.used.add(s.uid)
        return picked

    def _plant_lost(self, ok_stored: list[Send]) -> None:
        """Acknowledged, then gone from every log. The last ok send of a producer to its queue,
        acknowledged at an offset nobody else names (a lost write usually also shows as an offset
        two messages claim; here only the loss is planted)."""
        last: dict[tuple[str, str, int], Send] = {}
        for snd in ok_stored:
            assert snd.msg is not None
            last[(snd.producer, snd.msg.group, snd.msg.queue_id)] = snd
        free = [snd for snd in sorted(last.values(), key=lambda x: x.invoke_us) if snd.uid not in self.used]
        n = self.cfg.plants.get("lost", 0)
        if len(free) < n:
            raise ValueError(f"not enough messages to plant {n} x lost: use more --events")
        for k, snd in enumerate(self.rng.sample(free, n)):
            assert snd.msg is not None
            self.streams[snd.msg.group].remove(snd.msg)
            snd.ack_offset = 2_000_000 + k
            self.used.add(snd.uid)
            self.plan["lost"].append(snd.uid)

    def _plant_logdup(self, ok_stored: list[Send]) -> None:
        for s in self._pick(ok_stored, self.cfg.plants.get("logdup", 0), "logdup"):
            assert s.msg is not None
            stream = self.streams[s.msg.group]
            k = stream.index(s.msg)
            copy = dataclasses.replace(s.msg, store_ms=s.msg.store_ms)
            stream.insert(k + 1, copy)
            s.msg = copy  # the retry is what was acknowledged
            self.plan["logdup"].append(s.uid)

    def _plant_korder(self) -> None:
        n = self.cfg.plants.get("korder", 0)
        if not n:
            return
        ok = {s.uid: s for s in self.sends if s.outcome == "ok" and s.stored}
        pairs = []
        for group, stream in self.streams.items():
            last: dict[tuple[str | None, str | None], int] = {}
            for k, m in enumerate(stream):
                if m.uid not in ok or m.uid in self.used:
                    last.pop((m.producer, m.key), None)
                    continue
                prev = last.get((m.producer, m.key))
                if prev is not None and stream[prev].seq == (m.seq or 0) - 1:
                    pairs.append((group, prev, k))
                last[(m.producer, m.key)] = k
        pairs = pairs[len(pairs) // 10 :]
        chosen: list[tuple[str, int, int]] = []
        for pair in self.rng.sample(pairs, len(pairs)):
            group, a, b = pair
            ua, ub = self.streams[group][a].uid, self.streams[group][b].uid
            if ua in self.used or ub in self.used:
                continue
            self.used.update((ua, ub))
            chosen.append(pair)
            if len(chosen) == n:
                break
        if len(chosen) < n:
            raise ValueError(f"not enough messages to plant {n} x korder: use more --events")
        for group, a, b in chosen:
            stream = self.streams[group]
            stream[a], stream[b] = stream[b], stream[a]
            self.plan["korder"].append(stream[b].uid)  # seq s, now after s + 1

    def _sampled(self, group: str, entries: list[Any]) -> None:
        """Sample ticks of one group and the log facts the sampler lines need (``synth_samples``)."""
        times = SS.entry_times(entries)
        start = min(snd.invoke_us for snd in self.sends)
        end = max(snd.complete_us for snd in self.sends) + SS.TAIL_US  # the sampler runs on through the drain
        ticks = SS.sampled_indexes(times, start, end)
        offsets = []
        for k, (_term, body, msgs) in enumerate(entries):
            if msgs or not is_batch(body):
                continue
            for _off, rec in decode_batch(body):
                cmd = decode_command(rec) if rec[:1] == b"C" else {}
                if cmd.get("op") == "offset.commit" and cmd.get("group") == SS.CONSUMER_GROUP:
                    offsets.append((k + 1, {str(q): int(o) for q, o in cmd["offsets"].items()}))
        self.sample_groups[group] = {"ticks": ticks, "terms": [t for t, _, _ in entries], "offsets": offsets}

    def write_replicas(self) -> None:
        """Every group's replica files (``synth_replicas``), with the replica plants."""
        plants, first, last = self.cfg.plants, self.groups[0], self.groups[-1]
        for group in self.groups:
            entries = R.build_entries(
                group,
                self.streams[group],
                self.term_changes,
                self.cfg.batch,
                self.cfg.queues,
                self.rng,
                scratch=group == first,
            )
            body = term = None
            if plants.get("diverge_body") and group == last:
                body = (self.nodes[-1], R.diverge_index(entries, 0.6))
                self.plan["diverge_body"].append({"group": group, "replica": body[0], "first_index": body[1]})
            if plants.get("diverge_chain") and group == first:
                term = (self.nodes[1], R.diverge_index(entries, 0.4))
                self.plan["diverge_chain"].append(
                    {"group": group, "replica": term[0], "first_index": term[1]}
                )
            self._sampled(group, entries)
            wanted = {c for _, c in self.sample_groups[group]["ticks"]}
            self.sample_groups[group]["chains"] = R.write_logs(
                self.run_dir, group, self.nodes, entries, self.cfg.segment_bytes, body, term, wanted
            )
            self.commits[group] = len(entries)
            self.queues_of[group] = R.write_state(
                self.run_dir, group, self.nodes, entries, 1 + len(self.term_changes), self.cfg.units_per_file
            )
            if group == first and plants.get("cq"):
                self._plant_cq(group)
            if group == first and self.cfg.torn_tail:
                R.tear(self.run_dir, group, self.nodes[-1])

    def _plant_cq(self, group: str) -> None:
        queues = self.queues_of[group]
        work = sorted(k for k in queues if k[0] == TOPIC)
        n = self.cfg.plants["cq"]
        if n > len(work):
            raise ValueError(f"only {len(work)} queues in {group} for {n} x cq")
        node = self.nodes[1]
        for key in self.rng.sample(work, n):
            missing = R.drop_unit(self.run_dir, group, node, key, queues[key], self.cfg.units_per_file)
            self.plan["cq"].append(
                {
                    "group": group,
                    "replica": node,
                    "topic": key[0],
                    "queue_id": key[1],
                    "missing_position": missing,
                }
            )

    # -- consumers -------------------------------------------------------------------------------------
    def make_receipts(self) -> tuple[Lines, list[dict[str, Any]]]:
        rng, plants = self.rng, self.cfg.plants
        ok = {s.uid: s for s in self.sends if s.outcome == "ok" and s.stored}
        unconsumed = set()
        candidates = [ok[m.uid] for g in self.groups for m in self.streams[g] if m.uid in ok]
        for s in self._pick(candidates, plants.get("unconsumed", 0), "unconsumed"):
            unconsumed.add(s.uid)
            self.plan["unconsumed"].append(s.uid)
        consumers = [f"c{k}" for k in range(self.cfg.consumers)]
        owner = {q: consumers[k % len(consumers)] for k, q in enumerate(self.queues)}
        per_queue: PerQueue = {}
        for g in self.groups:
            for (topic, qid), msgs in self.queues_of[g].items():
                if topic == TOPIC:
                    per_queue[(g, qid)] = msgs
        unseen = self._plant_unseen(per_queue, ok)
        lines: dict[str, list[tuple[int, dict[str, Any]]]] = {c: [] for c in consumers}
        for session, (q, msgs) in enumerate(sorted(per_queue.items()), start=1):
            t = 0
            for m in msgs:
                t = max(t + 1, m.store_ms * 1000 + rng.randrange(2000, 20000))
                m.receipt_us = t
                if m.uid not in unconsumed and m.uid not in unseen:
                    lines[owner[q]].append((t, _receipt(owner[q], t, m, session=session)))
        out = {c: [line for _, line in sorted(ls, key=lambda x: x[0])] for c, ls in lines.items()}
        self._plant_receipts(out, per_queue, ok, owner)
        drain_t = max(s.complete_us for s in self.sends) + 1_000_000
        drain = []
        for _q, msgs in sorted(per_queue.items()):
            for m in msgs:
                if m.uid not in unconsumed and m.uid not in unseen:
                    drain_t += 10
                    drain.append(_receipt("drain", drain_t, m, kind="drain"))
        self._plant_incons(drain, ok)
        return out, drain

    def _plant_unseen(self, per_queue: PerQueue, ok: dict[str, Send]) -> set[str]:
        """The last message of a queue, ok and in the log, that nobody reads."""
        out: set[str] = set()
        # not a queue the unexpected plant reads past its end (then reads would go past this one)
        free = sorted(per_queue)[self.cfg.plants.get("unexpected", 0) :]
        for q in self.rng.sample(free, self.cfg.plants.get("unseen", 0)):
            m = per_queue[q][-1]
            if m.uid not in ok or m.uid in self.used:
                raise ValueError(f"could not plant unseen in {q}: its last message is taken")
            self.used.add(m.uid)
            out.add(m.uid)
            self.plan["unseen"].append(m.uid)
        return out

    def _plant_incons(self, drain: list[dict[str, Any]], ok: dict[str, Send]) -> None:
        """A drain line naming another message of its queue (the other one's own line stays)."""
        for _ in range(self.cfg.plants.get("incons", 0)):
            for _attempt in range(1000):
                k = self.rng.randrange(len(drain) // 10, len(drain) * 9 // 10)
                a, b = drain[k], drain[k + 1]
                if (a["broker"], a["queue_id"]) != (b["broker"], b["queue_id"]):
                    continue
                if {a["unique_id"], b["unique_id"]} & self.used or a["unique_id"] not in ok:
                    continue
                self.used.update((a["unique_id"], b["unique_id"]))
                self.plan["incons"].append(
                    {"broker": a["broker"], "queue_id": a["queue_id"], "offset": a["queue_offset"],
                     "unique_ids": sorted((a["unique_id"], b["unique_id"]))}
                )
                drain[k] = {**a, "unique_id": b["unique_id"], "body_crc": b["body_crc"], "key": b["key"],
                            "seq": b["seq"], "producer": b["producer"]}
                break
            else:
                raise ValueError("could not plant incons: use more --events")

    def _plant_receipts(self, out: Lines, per_queue: PerQueue, ok: dict[str, Send], owner: Owner) -> None:
        self._plant_dup(out, ok)
        for _ in range(self.cfg.plants.get("qorder", 0)):
            self._plant_qorder(out)
        for _ in range(self.cfg.plants.get("rewind", 0)):
            self._plant_rewind(out, per_queue, ok, owner)
        self._plant_unexpected(out, per_queue, owner)
        for _ in range(self.cfg.plants.get("skip", 0)):
            self._plant_skip(out, ok)
        self._plant_corrupt(out, ok)

    def _plant_skip(self, out: Lines, ok: dict[str, Send]) -> None:
        """A receipt dropped from the middle of its session (the next one skips an offset)."""
        for _attempt in range(1000):
            c = self.rng.choice(sorted(out))
            ls = out[c]
            k = self.rng.randrange(len(ls) // 10, len(ls) * 9 // 10)
            r = ls[k]
            same = [j for j in range(k + 1, min(len(ls), k + 50)) if _stream_key(ls[j]) == _stream_key(r)]
            before = [j for j in range(max(0, k - 50), k) if _stream_key(ls[j]) == _stream_key(r)]
            if not same or not before or r["unique_id"] in self.used or r["unique_id"] not in ok:
                continue
            nxt = ls[same[0]]
            if nxt["queue_offset"] != r["queue_offset"] + 1 or nxt["unique_id"] in self.used:
                continue
            self.used.update((r["unique_id"], nxt["unique_id"]))
            del ls[k]
            self.plan["skip"].append(nxt["unique_id"])
            return
        raise ValueError("could not plant skip: use more --events")

    def _plant_corrupt(self, out: Lines, ok: dict[str, Send]) -> None:
        index = [(c, k) for c, ls in sorted(out.items()) for k in range(len(ls))]
        candidates = [ok[out[c][k]["unique_id"]] for c, k in index if out[c][k]["unique_id"] in ok]
        where = {out[c][k]["unique_id"]: (c, k) for c, k in index}
        for snd in self._pick(candidates, self.cfg.plants.get("corrupt", 0), "corrupt"):
            c, k = where[snd.uid]
            out[c][k] = {**out[c][k], "body_crc": out[c][k]["body_crc"] ^ 0x10}
            self.plan["corrupt"].append(snd.uid)

    def _plant_dup(self, out: Lines, ok: dict[str, Send]) -> None:
        """An extra receipt right after the first one."""
        plants = self.cfg.plants
        index = {line["unique_id"]: (c, k) for c, ls in out.items() for k, line in enumerate(ls)}
        candidates = [ok[u] for u in index if u in ok]
        for s in self._pick(candidates, plants.get("dup", 0), "dup"):
            c, k = index[s.uid]
            out[c].insert(k + 1, dict(out[c][k], time_us=out[c][k]["time_us"]))
            index = {line["unique_id"]: (cc, kk) for cc, ls in out.items() for kk, line in enumerate(ls)}
            self.plan["dup"].append(s.uid)

    def _plant_qorder(self, out: Lines) -> None:
        """Two adjacent receipts of one queue swapped in its consumer's file."""
        for _attempt in range(1000):
            c = self.rng.choice(sorted(out))
            ls = out[c]
            k = self.rng.randrange(len(ls) // 10, len(ls) * 9 // 10)
            a = ls[k]
            nxt = [j for j in range(k + 1, min(len(ls), k + 50)) if _stream_key(ls[j]) == _stream_key(a)]
            if not any(_stream_key(ls[j]) == _stream_key(a) for j in range(max(0, k - 50), k)):
                continue  # o-1 must come before it in the session
            if not nxt:
                continue
            b = ls[nxt[0]]
            if {a["unique_id"], b["unique_id"]} & self.used or b["queue_offset"] != a["queue_offset"] + 1:
                continue
            after = [j for j in range(nxt[0] + 1, min(len(ls), nxt[0] + 50)) if _stream_key(ls[j]) == _stream_key(a)]
            if not after or ls[after[0]]["unique_id"] in self.used:
                continue
            c_uid = ls[after[0]]["unique_id"]
            self.used.update((a["unique_id"], b["unique_id"], c_uid))
            ta, tb = a["time_us"], b["time_us"]
            ls[k], ls[nxt[0]] = dict(b, time_us=ta), dict(a, time_us=tb)
            # o+1 right after o-1 (skip), then o (backwards), then o+2 right after o (skip)
            self.plan["qorder"].append({"skip": [b["unique_id"], c_uid], "backwards": [a["unique_id"]]})
            break
        else:
            raise ValueError("could not plant qorder: use more --events")

    def _plant_rewind(self, out: Lines, per_queue: PerQueue, ok: dict[str, Send], owner: Owner) -> None:
        """A consumer re-reads REWIND_SPAN offsets of one queue after a later receipt."""
        for _attempt in range(1000):
            q = self.rng.choice(sorted(per_queue))
            msgs = per_queue[q]
            if len(msgs) < 4 * REWIND_SPAN:
                continue
            start = self.rng.randrange(len(msgs) // 4, len(msgs) // 2)
            span = msgs[start : start + REWIND_SPAN]
            if any(m.uid in self.used or m.uid not in ok for m in span):
                continue
            c = owner[q]
            ls = out[c]
            last = max(k for k, line in enumerate(ls) if line["unique_id"] == span[-1].uid)
            session = 1000 + len(self.plan["rewind"])  # a rebalance: a new session of the queue
            redelivered = [dict(_receipt(c, ls[last]["time_us"], m, session=session)) for m in span]
            for j in range(last + 1, len(ls)):  # what follows in that queue belongs to the new session
                if (ls[j]["broker"], ls[j]["queue_id"]) == (q[0], q[1]):
                    ls[j] = {**ls[j], "session": session}
            out[c][last + 1 : last + 1] = redelivered
            self.used.update(m.uid for m in span)
            self.plan["rewind"] += [m.uid for m in span]
            break
        else:
            raise ValueError("could not plant rewind: use more --events")

    def _plant_unexpected(self, out: Lines, per_queue: PerQueue, owner: Owner) -> None:
        """Receipts of messages nobody sent (at offsets past the queue's end)."""
        plants = self.cfg.plants
        for k in range(plants.get("unexpected", 0)):
            q = sorted(per_queue)[k % len(per_queue)]
            c = owner[q]
            uid = _uid(self.rng)
            fake = Msg(uid, TOPIC, q[0], q[1], None, None, None, T0_US // 1000, T0_US // 1000)
            fake.offset = len(per_queue[q]) + 1000 + k
            fake.position = 1 << 40
            t = (out[c][-1]["time_us"] if out[c] else T0_US) + 1
            out[c].append(_receipt(c, t, fake))
            self.plan["unexpected"].append(uid)

    # -- files -------------------------------------------------------------------------------------------
    def write(self) -> None:
        os.makedirs(os.path.join(self.run_dir, "history"), exist_ok=True)
        self.make_sends()
        self.make_streams()
        self.write_replicas()
        receipts, drain = self.make_receipts()
        self._plant_aborted()
        self._plant_ackoff()
        samples, sample_plan = SS.sample_lines(
            self.sample_groups, self.nodes, TOPIC, self.cfg.plants, self.rng,
            [(f["time_us"], f["time_us"] + STALL_US) for f in self.faults if f["action"] == "apply"],
        )
        for kind, rows in sample_plan.items():
            self.plan[kind] = rows
        hist = os.path.join(self.run_dir, "history")
        by_producer: dict[str, list[Send]] = defaultdict(list)
        for s in self.sends:
            by_producer[s.producer].append(s)
        for p, sends in sorted(by_producer.items()):
            _write_jsonl(os.path.join(hist, f"sends-{p}.jsonl"), (_send_line(s) for s in sends))
        for c, lines in sorted(receipts.items()):
            _write_jsonl(os.path.join(hist, f"receipts-{c}.jsonl"), lines)
        _write_jsonl(os.path.join(hist, "drain.jsonl"), drain)
        _write_jsonl(os.path.join(hist, "samples.jsonl"), samples)
        _write_jsonl(os.path.join(self.run_dir, "faults.jsonl"), self.faults)
        self._write_run_json()

    def _plant_aborted(self) -> None:
        ok_stored = [snd for snd in self.sends if snd.outcome == "ok" and snd.stored]
        for snd in self._pick(ok_stored, self.cfg.plants.get("aborted", 0), "aborted"):
            snd.outcome, snd.error = "fail", "NOT_LEADER"
            self.plan["aborted"].append(snd.uid)

    def _plant_ackoff(self) -> None:
        """The last ok send of a producer to a queue acknowledged at another offset."""
        last: dict[tuple[str, str, int], Send] = {}
        for snd in sorted(self.sends, key=lambda x: x.invoke_us):
            if snd.outcome == "ok" and snd.msg is not None:
                last[(snd.producer, snd.msg.group, snd.msg.queue_id)] = snd
        free = [snd for snd in last.values() if snd.uid not in self.used]
        n = self.cfg.plants.get("ackoff", 0)
        if len(free) < n:
            raise ValueError(f"not enough messages to plant {n} x ackoff")
        for snd in self.rng.sample(free, n):
            assert snd.msg is not None
            snd.ack_offset = snd.msg.offset + 1_000_000
            self.used.add(snd.uid)
            self.plan["ackoff"].append(snd.uid)

    def _write_run_json(self) -> None:
        start = min(s.invoke_us for s in self.sends)
        end = max(s.complete_us for s in self.sends)
        processes = []
        statuses = []
        for k, g in enumerate(self.groups):
            for j, node in enumerate(self.nodes):
                name = f"{g}-{node}"
                processes.append(
                    {
                        "name": name,
                        "kind": "broker",
                        "group": g,
                        "node_id": node,
                        "pid": 0,
                        "host": "127.0.0.1",
                        "ports": {"raft": 40911 + 10 * k + j},
                    }
                )
                statuses.append(
                    {
                        "name": name,
                        "group": g,
                        "node_id": node,
                        "role": "leader" if j == 0 else "follower",
                        "term": 1 + len(self.term_changes),
                        "commit_index": self.commits[g],
                        "applied_index": self.commits[g],
                    }
                )
        drain_errors = [f"RaftNode00 {TOPIC}:0: planted" for _ in range(self.cfg.plants.get("drainerr", 0))]
        run = {
            "tool": "spark_jobs.synth",
            "version": 1,
            "start_us": start,
            "end_us": end,
            "options": {"events": self.cfg.events, "seed": self.cfg.seed, "plants": self.cfg.plants},
            "topics": [TOPIC],
            "cluster": {"processes": processes},
            "replicas": statuses,
            "sampler": {"group": SS.CONSUMER_GROUP, "topic": TOPIC, "interval_s": SS.SAMPLE_INTERVAL_US / 1e6},
            "drain_errors": drain_errors,
        }
        self.plan["drainerr"] = drain_errors
        _write_json(os.path.join(self.run_dir, "run.json"), run)
        cluster_dir = os.path.join(self.run_dir, "cluster")
        _write_json(os.path.join(cluster_dir, "cluster.json"), {"processes": processes})
        plan = {
            "config": dataclasses.asdict(self.cfg),
            "plants": self.plan,
            "sends": len(self.sends),
            "receipts": None,
        }
        _write_json(os.path.join(self.run_dir, "synth.json"), plan)


def _stream_key(line: dict[str, Any]) -> tuple[Any, ...]:
    return (line["broker"], line["queue_id"], line.get("session"))


def _receipt(consumer: str, t: int, m: Msg, kind: str = "receipt", session: int | None = None) -> dict[str, Any]:
    return {
        "type": kind,
        "consumer": consumer,
        "time_us": t,
        "topic": m.topic,
        "broker": m.group,
        "queue_id": m.queue_id,
        "queue_offset": m.offset,
        "msg_id": f"{m.group}:{m.position:016X}",
        "unique_id": m.uid,
        "key": m.key,
        "seq": m.seq,
        "producer": m.producer,
        "born_us": m.born_ms * 1000,
        "store_us": m.store_ms * 1000,
        "session": session,
        "body_crc": R.body_crc(m.uid) if m.topic == TOPIC else None,
    }


def _send_line(s: Send) -> dict[str, Any]:
    ok = s.outcome == "ok"
    m = s.msg if ok else None
    line: dict[str, Any] = {
        "type": "send",
        "producer": s.producer,
        "unique_id": s.uid,
        "key": s.key,
        "seq": s.seq,
        "topic": TOPIC,
        "invoke_us": s.invoke_us,
        "complete_us": s.complete_us,
        "outcome": s.outcome,
        "error": s.error,
        "broker": None,
        "queue_id": None,
        "queue_offset": None,
        "msg_id": None,
        "store_us": None,
        "body_crc": R.body_crc(s.uid),
    }
    if m is not None:
        line.update(
            broker=m.group,
            queue_id=m.queue_id,
            queue_offset=m.offset if s.ack_offset is None else s.ack_offset,
            msg_id=f"{m.group}:{m.position:016X}",
            store_us=m.store_ms * 1000,
        )
    return line


def _write_jsonl(path: str, lines: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)


def _write_json(path: str, obj: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)


def generate(run_dir: str, cfg: SynthConfig) -> dict[str, Any]:
    """Write a synthetic run into ``run_dir`` (must not exist or be empty); returns the plan."""
    if os.path.exists(run_dir) and os.listdir(run_dir):
        raise FileExistsError(f"{run_dir} exists and is not empty")
    if cfg.plants.get("diverge_body", 0) > 1 or cfg.plants.get("diverge_chain", 0) > 1:
        raise ValueError("diverge_body and diverge_chain plant at most one replica each")
    if cfg.groups < 2 and cfg.plants.get("diverge_body") and cfg.plants.get("diverge_chain"):
        raise ValueError("diverge_body and diverge_chain together need --groups >= 2")
    os.makedirs(run_dir, exist_ok=True)
    b = _Builder(run_dir, cfg)
    b.write()
    with open(os.path.join(run_dir, "synth.json"), encoding="utf-8") as f:
        plan: dict[str, Any] = json.load(f)
    return plan


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spark_jobs.synth", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--events", type=int, default=SynthConfig.events, help="sends + receipts")
    ap.add_argument("--groups", type=int, default=SynthConfig.groups)
    ap.add_argument("--producers", type=int, default=SynthConfig.producers)
    ap.add_argument("--consumers", type=int, default=SynthConfig.consumers)
    ap.add_argument("--queues", type=int, default=SynthConfig.queues, help="queues per group")
    ap.add_argument("--batch", type=int, default=SynthConfig.batch, help="max records per Raft entry")
    ap.add_argument("--seed", type=int, default=SynthConfig.seed)
    ap.add_argument("--segment-bytes", type=int, default=SynthConfig.segment_bytes)
    ap.add_argument("--units-per-file", type=int, default=SynthConfig.units_per_file)
    ap.add_argument(
        "--torn-tail", action="store_true", help="leave half an entry at the end of one replica's log"
    )
    ap.add_argument("--plant", default="", help=f"kind=count,... kinds: {','.join(PLANT_KINDS)}")
    args = ap.parse_args(argv)
    try:
        cfg = SynthConfig(
            events=args.events,
            groups=args.groups,
            producers=args.producers,
            consumers=args.consumers,
            queues=args.queues,
            batch=args.batch,
            seed=args.seed,
            segment_bytes=args.segment_bytes,
            units_per_file=args.units_per_file,
            torn_tail=args.torn_tail,
            plants=parse_plants(args.plant),
        )
        plan = generate(args.run_dir, cfg)
    except (ValueError, FileExistsError) as exc:
        print(f"synth: {exc}", file=sys.stderr)
        return 2
    planted = {k: len(v) for k, v in plan["plants"].items() if v}
    print(f"wrote {args.run_dir}: {plan['sends']} sends, seed {cfg.seed}, plants {planted or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
