"""Raft's safety properties, checked after every step of a simulation.

- Election safety: at most one leader per term.
- Log matching: wherever two logs hold an entry with the same index and term, their chain CRCs
  are equal (the chain CRC covers the whole prefix, so the prefixes are equal too).
- Leader completeness: a new leader holds every committed entry.
- Committed entries are never lost or changed: no replica truncates at or below its own commit
  index, and an entry at a committed index always has the committed term and chain CRC.
- State machine safety: every replica applies the committed entries in order, each once (across
  restarts too), so all apply the same sequence.
- Acknowledged appends are committed (with the term they were written in) when acknowledged.
- Applying never stops a replica, and every replica reaches the same outcome for every committed
  entry (each body's result, a refusal included: a poison body is refused by all, applied by none).

A broken property raises ``Violation`` with the step and the detail; the simulator prints the seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dledger.records import Refused


class Violation(AssertionError):
    pass


@dataclass
class Checker:
    leaders: dict[int, str] = field(default_factory=dict)  # term -> node id
    entries: dict[tuple[int, int], int] = field(default_factory=dict)  # (index, term) -> chain crc
    committed: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (term, chain)
    max_committed: int = 0
    voted_term: dict[str, int] = field(default_factory=dict)  # node -> highest term it voted in
    step: int = 0
    checks: int = 0
    outcomes: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # index -> every body's result
    refused: int = 0  # committed bodies refused (counted once, by the first replica to apply them)

    def fail(self, what: str) -> None:
        raise Violation(f"step {self.step}: {what}")

    def on_leader(self, node: str, term: int) -> None:
        other = self.leaders.setdefault(term, node)
        if other != node:
            self.fail(f"two leaders in term {term}: {other} and {node}")

    def on_entry(self, node: str, index: int, term: int, chain: int) -> None:
        """An entry a replica holds (checked once per index after each append or truncation)."""
        self.checks += 1
        known = self.entries.setdefault((index, term), chain)
        if known != chain:
            self.fail(
                f"log matching: {node} holds ({index}, term {term}) with chain {chain:#x}, another {known:#x}"
            )
        c = self.committed.get(index)
        if c is not None and c[0] == term and c[1] != chain:
            self.fail(f"{node} holds committed index {index} (term {term}) with a different prefix")

    def on_commit(self, node: str, index: int, term: int, chain: int) -> None:
        """``node`` learned that ``index`` is committed, and holds it as (term, chain)."""
        known = self.committed.setdefault(index, (term, chain))
        if known != (term, chain):
            self.fail(
                f"committed entry changed: {node} has index {index} as term {term}, committed as term {known[0]}"
            )
        self.max_committed = max(self.max_committed, index)

    def on_truncate(self, node: str, from_index: int, commit_index: int) -> None:
        if from_index <= commit_index:
            self.fail(
                f"{node} truncated its log from {from_index}, at or below its commit index {commit_index}"
            )

    def on_become_leader(self, node: str, term: int, holds: dict[int, tuple[int, int] | None]) -> None:
        """``holds``: committed index -> (term, chain) as the new leader holds it (None if absent)."""
        self.on_leader(node, term)
        for index, have in holds.items():
            want = self.committed[index]
            if have is None or have != want:
                self.fail(
                    f"leader completeness: {node} leads term {term} without committed entry {index} "
                    f"(has {have}, committed {want})"
                )

    def on_apply(self, node: str, index: int, expected_next: int, chain: int) -> None:
        if index != expected_next:
            self.fail(f"{node} applied index {index}, expected {expected_next} (skipped or applied twice)")
        c = self.committed.get(index)
        if c is None:
            self.fail(f"{node} applied index {index} before it was known committed")
        elif c[1] != chain:
            self.fail(f"{node} applied index {index} with chain {chain:#x}, committed {c[1]:#x}")

    def on_outcome(self, node: str, index: int, results: tuple[Any, ...]) -> None:
        """What applying ``index`` produced on ``node``: the same on every replica, every time."""
        known = self.outcomes.setdefault(index, results)
        if known is results:
            self.refused += sum(1 for r in results if isinstance(r, Refused))
        elif known != results:
            self.fail(f"{node} applied index {index} to {results!r:.200}, another replica to {known!r:.200}")

    def on_apply_failed(self, node: str, exc: BaseException) -> None:
        self.fail(f"{node} stopped: applying raised instead of refusing ({exc!r:.300})")

    def on_vote_sent(self, node: str, term: int) -> None:
        self.voted_term[node] = max(term, self.voted_term.get(node, 0))

    def on_restart(self, node: str, term: int) -> None:
        """Figure 2: currentTerm and votedFor are on stable storage before a server answers an RPC."""
        voted = self.voted_term.get(node, 0)
        if term < voted:
            self.fail(f"{node} restarted at term {term} after voting in term {voted}: its vote was not durable")

    def on_leader_commit(self, node: str, term: int, index: int, entry_term: int) -> None:
        """A leader moved its commit index to ``index`` by counting replicas (Raft §5.4.2)."""
        if entry_term != term:
            self.fail(f"leader {node} (term {term}) committed index {index} of term {entry_term} by counting replicas")

    def on_ack(self, index: int, term: int) -> None:
        c = self.committed.get(index)
        if c is None or c[0] != term:
            self.fail(f"append acknowledged at ({index}, term {term}) but committed there: {c}")
