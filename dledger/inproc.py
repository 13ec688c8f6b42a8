"""Raft links inside one process: the in-process twin of the TCP peer transport.

``InProcNetwork`` connects the ``InProcTransport`` of each replica in this process. A message is
encoded with the real peer codec (``peer_codec``), so nothing is shared between replicas, put in the
receiver's inbox and handed to its SyncObj on the receiver's own thread (``drain``, run by the
receiver's loop soon after ``wake``: never inside the sender's call). A link is like a TCP
connection: both replicas attached and the link not cut; ``cut``/``heal`` partition replicas, and
each side learns of it as a connect/disconnect.

The deterministic simulator (``dledger.sim``) uses the same transport with a network of its own
that decides when (and whether) a message arrives.

Threads: ``post`` and the network's methods may be called from any thread; everything else runs
on the owning replica's thread.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any, Protocol

from pysyncobj.transport import Transport

from dledger import peer_codec


class Network(Protocol):
    """What a transport asks of the network it is attached to (InProcNetwork, the simulator's)."""

    def attach(self, transport: InProcTransport) -> None: ...

    def detach(self, address: str) -> None: ...

    def deliver(self, src: str, dst: str, frame: bytes) -> bool: ...


class InProcTransport(Transport):
    def __init__(
        self,
        network: Network,
        sync_obj: Any,
        self_node: Any,
        other_nodes: Any,
        wake: Callable[[], None] = lambda: None,
    ):
        super().__init__(sync_obj, self_node, other_nodes)
        self.address: str = self_node.address
        self._network = network
        self._nodes = {n.address: n for n in other_nodes}
        self._strangers: dict[str, Any] = {}  # peers that are not members here (see drain)
        self._sync = sync_obj
        self._inbox: collections.deque[tuple[str, str, bytes]] = collections.deque()
        self._wake = wake
        self._ready = False
        self._up: set[str] = set()
        self.dropped_frames = 0

    @property
    def peer_addresses(self) -> list[str]:
        return list(self._nodes)

    # -- pysyncobj's Transport ------------------------------------------------------------------
    def tryGetReady(self) -> None:
        if not self._ready:
            self._ready = True
            self._network.attach(self)

    @property
    def ready(self) -> bool:
        return self._ready

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        if node.address not in self._up:
            return False
        return self._network.deliver(self.address, node.address, peer_codec.encode(message))

    def destroy(self) -> None:
        self._network.detach(self.address)
        self._ready = False

    def addNode(self, node: Any) -> None:
        """A member joined (issue 27): the link comes up if both ends are attached."""
        self._nodes[node.address] = node
        self._strangers.pop(node.address, None)
        connect = getattr(self._network, "connect", None)
        if connect is not None and self._ready:
            connect(self.address, node.address)

    def dropNode(self, node: Any) -> None:
        """A member left: it is no member here any more, but the link stays (as a TCP peer that
        holds the password reconnects and is accepted): what it sends is handled as a stranger's
        (DLedgerSyncObj.dl_node_for: its votes ignored, its AppendEntries answered by the term)."""
        known = self._nodes.pop(node.address, None)
        if known is not None and node.address in self._up:
            self._strangers[node.address] = known

    def pending_bytes(self, node: Any) -> int:
        return 0

    def is_up(self, address: str) -> bool:
        return address in self._up

    # -- inbox ----------------------------------------------------------------------------------
    def post(self, kind: str, src: str, payload: bytes = b"") -> None:
        """From any thread: queue one event for the replica's thread ('msg', 'up' or 'down')."""
        self._inbox.append((kind, src, payload))
        self._wake()

    @property
    def has_input(self) -> bool:
        return bool(self._inbox)

    def drain(self, max_items: int = 10_000) -> int:
        """On the replica's thread: hand queued events to SyncObj, in arrival order."""
        n = 0
        while self._inbox and n < max_items:
            kind, src, payload = self._inbox.popleft()
            n += 1
            node = self._nodes.get(src) or self._strangers.get(src)
            if node is None:
                if kind != "up":
                    continue
                # Not a member here (yet): see DLedgerSyncObj.dl_node_for (a network link is
                # "authenticated" in process).
                node_for = getattr(self._sync, "dl_node_for", None)
                if node_for is None:
                    continue
                node = self._strangers[src] = node_for(src)
            if kind == "msg":
                if src not in self._up:
                    continue  # sent over a connection that has since gone down
                try:
                    message = peer_codec.decode(payload)
                except peer_codec.PeerCodecError:
                    self.dropped_frames += 1
                    continue
                self._onMessageReceived(node, message)
            elif kind == "up" and src not in self._up:
                self._up.add(src)
                self._onNodeConnected(node)
            elif kind == "down" and src in self._up:
                self._up.discard(src)
                self._strangers.pop(src, None)
                self._onNodeDisconnected(node)
        return n


class InProcNetwork:
    """The links between the replicas of one process (real time: messages arrive at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._transports: dict[str, InProcTransport] = {}
        self._cut: set[frozenset[str]] = set()

    def _linked(self, a: str, b: str) -> bool:
        return a in self._transports and b in self._transports and frozenset((a, b)) not in self._cut

    def attach(self, transport: InProcTransport) -> None:
        with self._lock:
            self._transports[transport.address] = transport
            # Linked with every replica either side lists (issue 27: see SimNetwork.attach).
            listing = [a for a, t in self._transports.items() if transport.address in t.peer_addresses]
            for peer in sorted(set(transport.peer_addresses) | set(listing)):
                if peer != transport.address and self._linked(transport.address, peer):
                    transport.post("up", peer)
                    self._transports[peer].post("up", transport.address)

    def detach(self, address: str) -> None:
        with self._lock:
            transport = self._transports.pop(address, None)
            if transport is None:
                return
            for peer, other in self._transports.items():  # everyone it was linked with (see attach)
                if peer in transport.peer_addresses or address in other.peer_addresses or other.is_up(address):
                    other.post("down", address)

    def deliver(self, src: str, dst: str, frame: bytes) -> bool:
        with self._lock:
            if not self._linked(src, dst):
                return False
            self._transports[dst].post("msg", src, frame)
            return True

    def connect(self, a: str, b: str) -> None:
        """``a`` learned of member ``b``: both ends hear the link come up (if both attached)."""
        with self._lock:
            if self._linked(a, b):
                self._transports[a].post("up", b)
                self._transports[b].post("up", a)

    def cut(self, a: str, b: str) -> None:
        """Partition ``a`` from ``b`` (both directions)."""
        with self._lock:
            if frozenset((a, b)) in self._cut:
                return
            linked = self._linked(a, b)
            self._cut.add(frozenset((a, b)))
            if linked:
                self._transports[a].post("down", b)
                self._transports[b].post("down", a)

    def heal(self, a: str, b: str) -> None:
        with self._lock:
            self._cut.discard(frozenset((a, b)))
            if self._linked(a, b):
                self._transports[a].post("up", b)
                self._transports[b].post("up", a)

    def isolate(self, a: str) -> None:
        with self._lock:
            peers = [p for p in self._transports if p != a]
        for p in peers:
            self.cut(a, p)

    def heal_all(self) -> None:
        with self._lock:
            cuts = [tuple(c) for c in self._cut]
        for a, b in cuts:
            self.heal(a, b)
