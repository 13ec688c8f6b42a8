"""The simulated network: delay, loss, duplication, reordering and partitions, all from one seed.

It plays ``InProcNetwork``'s part for ``InProcTransport`` (attach, detach, deliver), but a message
is not handed over at once: ``deliver`` draws its fate from the world's random generator and
schedules its arrival on the world's event queue. Messages are datagrams: one in flight when its
receiver crashes may still reach the restarted process (Raft assumes nothing better of a network).

Links are directed. ``cut(a, b)`` drops what ``a`` sends to ``b``; a link counts as *connected*
for pysyncobj (``up``/``down`` events) while both ends are attached and neither direction is cut
by a symmetric partition (a one-way cut keeps the connection but loses what crosses it, like a
half-dead TCP connection before its timeout).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dledger.inproc import InProcTransport


@dataclasses.dataclass
class LinkModel:
    """What the network does to each message (the world changes these during a run)."""

    delay_min_s: float = 0.0002
    delay_max_s: float = 0.002
    loss: float = 0.0
    duplicate: float = 0.0
    spike: float = 0.0  # share of messages delayed by up to spike_max_s (reordering)
    spike_max_s: float = 0.3


class SimNetwork:
    def __init__(self, rng: random.Random, schedule: Callable[[float, Callable[[], None]], None]):
        self._rng = rng
        self._schedule = schedule  # (delay from now, action)
        self.model = LinkModel()
        self._transports: dict[str, InProcTransport] = {}
        self._one_way: set[tuple[str, str]] = set()  # (src, dst) cut in that direction only
        self._both: set[frozenset[str]] = set()  # symmetric cuts
        self.sent = 0
        self.dropped = 0
        self.duplicated = 0

    # -- topology ---------------------------------------------------------------------------------
    def _connected(self, a: str, b: str) -> bool:
        return a in self._transports and b in self._transports and frozenset((a, b)) not in self._both

    def attach(self, transport: InProcTransport) -> None:
        self._transports[transport.address] = transport
        # Linked with every replica either side lists (one that lists it dials it, as over TCP:
        # a member the attaching replica does not know yet still reaches it; issue 27).
        listing = [a for a, t in self._transports.items() if transport.address in t.peer_addresses]
        for peer in sorted(set(transport.peer_addresses) | set(listing)):
            if peer != transport.address and self._connected(transport.address, peer):
                transport.post("up", peer)
                self._transports[peer].post("up", transport.address)

    def detach(self, address: str) -> None:
        transport = self._transports.pop(address, None)
        if transport is None:
            return
        for peer, other in self._transports.items():  # everyone it was linked with (see attach)
            if peer in transport.peer_addresses or address in other.peer_addresses or other.is_up(address):
                other.post("down", address)

    def connect(self, a: str, b: str) -> None:
        """``a`` learned of member ``b`` (a membership change): the link comes up at both ends."""
        if self._connected(a, b):
            self._transports[a].post("up", b)
            self._transports[b].post("up", a)

    def cut(self, a: str, b: str, one_way: bool = False) -> None:
        if one_way:
            self._one_way.add((a, b))
            return
        was = self._connected(a, b)
        self._both.add(frozenset((a, b)))
        if was:
            self._transports[a].post("down", b)
            self._transports[b].post("down", a)

    def heal_all(self) -> None:
        # Sorted: a set of frozensets of strings iterates in an order that follows PYTHONHASHSEED,
        # and the order of these "up" events decides what the replicas do next (replay).
        cuts = sorted(tuple(sorted(c)) for c in self._both)
        self._both.clear()
        self._one_way.clear()
        for a, b in cuts:
            if self._connected(a, b):
                self._transports[a].post("up", b)
                self._transports[b].post("up", a)

    # -- messages ---------------------------------------------------------------------------------
    def deliver(self, src: str, dst: str, frame: bytes) -> bool:
        if not self._connected(src, dst):
            return False
        self.sent += 1
        rng, m = self._rng, self.model
        if (src, dst) in self._one_way or rng.random() < m.loss:
            self.dropped += 1
            return True  # the sender cannot tell
        copies = 2 if rng.random() < m.duplicate else 1
        self.duplicated += copies - 1
        for _ in range(copies):
            delay = rng.uniform(m.delay_min_s, m.delay_max_s)
            if rng.random() < m.spike:
                delay += rng.uniform(0, m.spike_max_s)
            self._schedule(delay, lambda: self._arrive(src, dst, frame))
        return True

    def _arrive(self, src: str, dst: str, frame: bytes) -> None:
        transport = self._transports.get(dst)
        if transport is None or frozenset((src, dst)) in self._both or (src, dst) in self._one_way:
            self.dropped += 1
            return
        transport.post("msg", src, frame)
