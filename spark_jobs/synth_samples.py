"""The sampler's lines of synthetic runs (``synth``): what ``chaos.sampler`` would have read from
every replica every ``interval_us``, derived from the logs ``synth_replicas`` wrote.

An entry's time is the store time of its last message (commands and no-ops take the time of the
entry before them); at time ``t`` every replica has committed and applied every entry of time
<= t (no follower lag), its term is the term of its last entry, its chain CRC at the commit index
is its own log's (a replica planted to diverge reports its own), and the consumer group's stored
offsets are the ``offset.commit`` commands of the log up to the commit index, folded.

Plants (each one sample line, or a run of them, changed; ``synth`` lists them in synth.json):
  prefix       a follower's sample reports a log ending 3 entries before the commit index it
               reported in its previous sample (committed_prefix: shrank)
  crc          a follower's sample reports another chain CRC at its commit index
               (commit_crc_mismatch; committed_prefix: changed, against its final log)
  truncation   a follower's truncation counter grows by 3 within one term (nonconflicting_truncation)
  offset       one sample reads a queue's stored offset 7 lower than the sample before it
               (offset_regression)
  election     the first group's term (and its log's last term) grows by one outside every fault
               window, from one sample on (elections_without_fault, a note)
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from typing import Any

SAMPLE_INTERVAL_US = 250_000
TAIL_US = 20_000_000  # samples go on this long after the last send (settle, drain)
CONSUMER_GROUP = "chaos_consumer"
SAMPLE_PLANTS = ("prefix", "crc", "truncation", "offset", "election")


def entry_times(entries: Sequence[Any]) -> list[int]:
    """Per entry (index k+1): its time in µs (module doc)."""
    out: list[int] = []
    last = 0
    for _term, _body, msgs in entries:
        if msgs:
            last = max(last, max(m.store_ms for m in msgs) * 1000)
        out.append(last)
    return out


def sampled_indexes(times: list[int], start_us: int, end_us: int) -> list[tuple[int, int]]:
    """(sample time, commit index at that time) every SAMPLE_INTERVAL_US from start to end."""
    out = []
    t = start_us
    while t <= end_us:
        out.append((t, bisect.bisect_right(times, t)))
        t += SAMPLE_INTERVAL_US
    return out


def sample_lines(
    groups: dict[str, dict[str, Any]],
    nodes: list[str],
    topic: str,
    plants: dict[str, int],
    rng: random.Random,
    fault_windows: list[tuple[int, int]],
) -> tuple[list[dict[str, Any]], dict[str, list[Any]]]:
    """The lines of samples.jsonl and the plan of the sample plants. ``groups[g]`` holds the group's
    ``ticks`` [(time, commit index)], ``terms`` (per entry), ``chains`` {node: {index: chain CRC}}
    and ``offsets`` [(index, {queue id: offset})] (the log's offset commits, in index order)."""
    plan: dict[str, list[Any]] = {k: [] for k in SAMPLE_PLANTS}
    rows: list[dict[str, Any]] = []
    bumps: dict[str, int] = {}  # group -> time from which its term is one higher (election plant)
    for gk, (group, g) in enumerate(sorted(groups.items())):
        if gk == 0 and plants.get("election"):
            quiet = [t for t, _ in g["ticks"][2:] if _outside(t, fault_windows)]
            if not quiet:
                raise ValueError("no sample outside every fault window to plant an election in")
            bumps[group] = quiet[len(quiet) // 2]
    for group, g in sorted(groups.items()):
        commit_offsets = g["offsets"]
        keys = [k for k, _ in commit_offsets]
        for t, commit in g["ticks"]:
            folded: dict[str, int] = {}
            for _k, offs in commit_offsets[: bisect.bisect_right(keys, commit)]:
                folded.update(offs)
            for j, node in enumerate(nodes):
                term = last_term = g["terms"][commit - 1] if commit else 1
                if group in bumps and t >= bumps[group]:
                    term, last_term = term + 1, last_term + 1  # a new leader, its no-op written
                rows.append({
                    "type": "sample", "time_us": t, "replica": f"{group}-{node}", "group": group, "node_id": node,
                    "pid": 1000 + 10 * sorted(groups).index(group) + j, "role": "LEADER" if j == 0 else "FOLLOWER",
                    "term": term, "leader_id": nodes[0], "commit_index": commit, "applied_index": commit,
                    "last_index": commit, "last_term": last_term,
                    "chain_crc_at_commit": g["chains"][node].get(commit), "entries_truncated": 0,
                    "offsets": dict(folded),
                })
    if bumps:
        group, t = next(iter(bumps.items()))
        plan["election"].append({"group": group, "time_us": t})
    _plant(rows, plants, rng, plan)
    rows.sort(key=lambda r: (r["time_us"], r["replica"]))
    return rows, plan


def _outside(t: int, windows: list[tuple[int, int]]) -> bool:
    return all(not (a <= t <= h + 10_000_000) for a, h in windows)


def _plant(rows: list[dict[str, Any]], plants: dict[str, int], rng: random.Random, plan: dict[str, list[Any]]) -> None:
    """Change sample lines of followers in the middle of the run, one plant per replica."""
    by_replica: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_replica.setdefault(r["replica"], []).append(r)
    followers = sorted(k for k, v in by_replica.items() if v[0]["role"] == "FOLLOWER")
    rng.shuffle(followers)
    for kind in ("prefix", "crc", "truncation", "offset"):
        for _ in range(plants.get(kind, 0)):
            if not followers:
                raise ValueError(f"not enough replicas to plant {kind}")
            replica = followers.pop()
            series = by_replica[replica]
            # a sample whose commit index differs from both neighbours' (so each plant shows once)
            fits = [
                k for k in range(2, len(series) - 1)
                if series[k - 1]["commit_index"] + 3 < series[k]["commit_index"] < series[k + 1]["commit_index"]
                and series[k - 1]["offsets"]
            ]
            if not fits:
                raise ValueError(f"no sample of {replica} fits a {kind} plant: use more --events")
            k = fits[len(fits) // 2]
            s = series[k]
            if kind == "prefix":
                s["last_index"] = s["commit_index"] = series[k - 1]["commit_index"] - 3
                s["chain_crc_at_commit"] = None
                plan[kind].append({"replica": replica, "time_us": s["time_us"]})
            elif kind == "crc":
                s["chain_crc_at_commit"] ^= 0x5A5A
                plan[kind].append({"replica": replica, "commit_index": s["commit_index"], "time_us": s["time_us"]})
            elif kind == "truncation":
                for later in series[k:]:
                    later["entries_truncated"] = 3
                plan[kind].append({"replica": replica, "time_us": s["time_us"]})
            else:
                prev = series[k - 1]["offsets"]
                q = max(prev, key=lambda x: (prev[x], x))
                s["offsets"] = {**s["offsets"], q: prev[q] - 7}
                plan[kind].append({"replica": replica, "queue_id": int(q), "time_us": s["time_us"]})
