"""The Raft peer port (dledger/peer_tcp.py) against attackers on the network (issue 10, finding 2 and 5).

A real 3-node group (threads, TCP) runs while raw sockets attack one node's Raft port: frames far
over any limit, HTTP, pickles, floods of idle connections, wrong passwords, unknown identities,
replayed handshakes. The group keeps its leader throughout; every attack ends in a closed socket.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import pickle
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from dledger import peer_codec
from dledger.peer_tcp import _ACCEPT, _CONFIRM, _HELLO, _key_id, _raw_public, _session_keys, pre_shared_key
from dledger.waiting import wait_until_sync
from tests.dledger.harness import PASSWORD, InProcCluster, wait_until


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _recv_frame(sock: socket.socket, timeout_s: float = 3.0) -> bytes | None:
    sock.settimeout(timeout_s)
    head = b""
    try:
        while len(head) < 4:
            chunk = sock.recv(4 - len(head))
            if not chunk:
                return None
            head += chunk
        (n,) = struct.unpack(">I", head)
        body = b""
        while len(body) < n:
            chunk = sock.recv(n - len(body))
            if not chunk:
                return None
            body += chunk
        return body
    except (ConnectionResetError, TimeoutError):
        return None


def _closed_by_peer(sock: socket.socket, timeout_s: float = 5.0) -> bool:
    sock.settimeout(timeout_s)
    try:
        while True:
            if sock.recv(65536) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


class Initiator:
    """A scripted peer speaking the handshake, with whatever password and identity a test picks."""

    def __init__(self, target: str, group: str, ident: str, password: str):
        host, _, port = target.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=3)
        self.group, self.ident = group.encode(), ident.encode()
        self.psk = pre_shared_key(password, group)
        self.eph = X25519PrivateKey.generate()
        self.nonce = os.urandom(16)
        self.hello = (
            _HELLO
            + bytes([len(self.group)])
            + self.group
            + bytes([len(self.ident)])
            + self.ident
            + _raw_public(self.eph)
            + self.nonce
            + _key_id(self.psk)
        )

    def handshake(self) -> tuple[bytes | None, bytes | None]:
        """Returns (the CONFIRM frame sent, the session keys) or (None, None) if refused."""
        self.sock.sendall(_frame(self.hello))
        accept = _recv_frame(self.sock)
        if accept is None or not accept.startswith(_ACCEPT):
            return None, None
        n = accept[4]
        at = 5 + n
        peer_pub, nonce_a, mac_a = accept[at : at + 32], accept[at + 32 : at + 48], accept[at + 48 :]
        transcript = self.hello + accept[: at + 48]
        shared = self.eph.exchange(X25519PublicKey.from_public_bytes(peer_pub))
        keys = _session_keys(self.psk, shared, self.nonce, nonce_a, transcript)
        # An impostor cannot check mac_A (it lacks the password) but answers anyway.
        self.acceptor_proved = hmac.compare_digest(mac_a, hmac.new(keys[:32], b"A" + transcript, "sha256").digest())
        confirm = _CONFIRM + hmac.new(keys[:32], b"I" + transcript + mac_a, "sha256").digest()
        self.sock.sendall(_frame(confirm))
        return confirm, keys


@pytest.fixture
async def group(tmp_path: Path) -> Any:
    cluster = InProcCluster(str(tmp_path))
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop()


async def _steady(cluster: InProcCluster) -> tuple[Any, int]:
    leader = await cluster.leader()
    await leader.append([b"before"])
    return leader, leader.term


async def _still_leading(cluster: InProcCluster, leader: Any, term: int) -> None:
    await leader.append([b"after"])
    for n in cluster.nodes.values():
        assert n.term == term and n.leader_id == leader.settings.self_id, "the attack cost an election"


def _raft_address(node: Any) -> str:
    return str(node.settings.peers[node.settings.self_id])


async def _in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def test_frames_over_the_limit_http_and_pickles_are_cut_off(group: InProcCluster) -> None:
    leader, term = await _steady(group)
    host, _, port = _raft_address(leader).rpartition(":")
    marker = "/tmp/dledger-pwned-marker"
    if os.path.exists(marker):
        os.remove(marker)

    class Evil:
        def __reduce__(self) -> Any:
            return (open, (marker, "w"))

    attacks = [
        struct.pack(">I", 100 << 20) + os.urandom(1 << 16),  # claims 100 MiB
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # read as a 1.2 GB frame by pysyncobj
        _frame(pickle.dumps(Evil())),  # the old peer layer unpickled frames
        _frame(os.urandom(300)),  # garbage of an acceptable size
        struct.pack("i", -5),  # a negative length
    ]

    def attack(payload: bytes) -> bool:
        with socket.create_connection((host, int(port)), timeout=3) as s:
            s.sendall(payload)
            return _closed_by_peer(s)

    for payload in attacks:
        assert await _in_thread(attack, payload), payload[:20]
    assert not os.path.exists(marker), "a pickle from the network was executed"
    counters = leader._sync.dl_transport.counters
    assert counters["oversized_frames"] >= 2 and counters["handshake_failed"] >= 2
    await _still_leading(group, leader, term)


async def test_idle_and_half_open_connections_are_capped_and_timed_out(group: InProcCluster) -> None:
    leader, term = await _steady(group)
    transport = leader._sync.dl_transport
    transport.handshake_timeout_s = 1.0
    host, _, port = _raft_address(leader).rpartition(":")
    socks: list[socket.socket] = []

    def connect_many() -> None:  # off the loop: the loop owns the replica and must accept them
        for _ in range(300):
            socks.append(socket.create_connection((host, int(port)), timeout=3))

    try:
        await _in_thread(connect_many)
        await wait_until(lambda: transport.counters["refused_cap"] > 0, 5, "the connection cap")
        # Everything that never finished a handshake is closed within the handshake timeout.
        await wait_until(
            lambda: all(c.state == "ready" for c in transport._conns.values()),
            10,
            "half-open connections closed",
        )
        assert len(transport._conns) <= transport.max_connections
    finally:
        for s in socks:
            s.close()
    await _still_leading(group, leader, term)


async def test_wrong_password_and_unknown_identity_are_refused(group: InProcCluster) -> None:
    leader, term = await _steady(group)
    follower = group.followers(leader)[0]
    target = _raft_address(leader)

    def try_handshake(ident: str, password: str, grp: str = "TestGroup") -> bool:
        init = Initiator(target, grp, ident, password)
        with init.sock:
            confirm, _keys = init.handshake()
            if confirm is None:
                return False
            return not _closed_by_peer(init.sock, timeout_s=1.0)

    assert not await _in_thread(try_handshake, _raft_address(follower), "not-the-password-at-all")
    # Issue 27: a peer that proves the password but is no member (a replica that missed a membership
    # change must hear a new member that leads) is accepted as a stranger and counted for nothing.
    def stranger() -> bool:
        init = Initiator(target, "TestGroup", "127.0.0.1:1", PASSWORD)
        with init.sock:
            confirm, _keys = init.handshake()
            return confirm is not None and init.acceptor_proved

    assert await _in_thread(stranger)
    assert "127.0.0.1:1" not in leader._sync.dl_nodes  # not a member: nothing replicated to it, no vote
    assert not await _in_thread(try_handshake, _raft_address(follower), PASSWORD, "OtherGroup")
    await _still_leading(group, leader, term)


async def test_a_recorded_handshake_cannot_be_replayed(group: InProcCluster) -> None:
    leader, term = await _steady(group)
    follower = group.followers(leader)[0]
    target = _raft_address(leader)
    counters = leader._sync.dl_transport.counters

    def record() -> tuple[Initiator, bytes]:
        init = Initiator(target, "TestGroup", _raft_address(follower), PASSWORD)
        confirm, keys = init.handshake()
        assert confirm is not None and keys is not None and init.acceptor_proved
        init.sock.close()
        return init, confirm

    failed_before = counters["handshake_failed"]
    init, confirm = await _in_thread(record)
    assert counters["handshake_failed"] == failed_before  # the genuine handshake went through

    def replay() -> bool:
        host, _, port = target.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=3) as s:
            s.sendall(_frame(init.hello))
            _recv_frame(s)  # a fresh ACCEPT: a new nonce and ephemeral key, so new session keys
            s.sendall(_frame(confirm))
            return _closed_by_peer(s)

    assert await _in_thread(replay)
    assert counters["handshake_failed"] == failed_before + 1
    await wait_until(lambda: all(n.leader_id == leader.settings.self_id for n in group.nodes.values()), 5, "steady")
    await _still_leading(group, leader, term)


async def test_a_tampered_frame_ends_the_session(group: InProcCluster) -> None:
    leader, term = await _steady(group)
    follower = group.followers(leader)[0]

    def session_with_tampered_frame() -> bool:
        init = Initiator(_raft_address(leader), "TestGroup", _raft_address(follower), PASSWORD)
        with init.sock:
            _confirm, keys = init.handshake()
            assert keys is not None
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            sealed = bytearray(AESGCM(keys[32:64]).encrypt((0).to_bytes(12, "big"), b"", None))
            sealed[-1] ^= 1
            init.sock.sendall(_frame(bytes(sealed)))
            return _closed_by_peer(init.sock)

    assert await _in_thread(session_with_tampered_frame)
    await wait_until(
        lambda: all(n.leader_id == leader.settings.self_id for n in group.nodes.values()), 5, "steady"
    )
    await _still_leading(group, leader, term)


async def test_the_listener_survives_running_out_of_descriptors(group: InProcCluster) -> None:
    leader, term = await _steady(group)
    transport = leader._sync.dl_transport
    listener = transport._listener
    real_accept = listener.accept
    failures = {"left": 5}

    class Exhausted:
        def __getattr__(self, name: str) -> Any:
            return getattr(listener, name)

        def accept(self) -> Any:
            if failures["left"] > 0:
                failures["left"] -= 1
                raise OSError(24, "Too many open files")
            return real_accept()

    transport._listener = Exhausted()  # type: ignore[assignment]
    host, _, port = _raft_address(leader).rpartition(":")
    try:
        probe = await _in_thread(socket.create_connection, (host, int(port)), 3)
        await wait_until(lambda: transport.counters["accept_errors"] > 0, 5, "an accept failure")
        # accepting resumes after the pause: a real peer's restart reconnects
        victim = group.followers(leader)[0].settings.self_id
        await group.stop_node(victim)
        await group.start_node(victim)
        await wait_until(lambda: group.nodes[victim].leader_id == leader.settings.self_id, 10, "reconnected")
        probe.close()
    finally:
        transport._listener = listener
    assert listener.fileno() >= 0
    await _still_leading(group, leader, term)


def test_codec_refuses_anything_but_known_messages() -> None:
    ok = peer_codec.encode({"type": "response_vote", "term": 3})
    assert peer_codec.decode(ok) == {"type": "response_vote", "term": 3}
    bad = [
        b"",
        b"\x93\x01\x63\x01",  # unknown type code
        peer_codec.encode({"type": "response_vote", "term": 3})[:-1],
        b"\x92\x02\x04",  # another version
        pickle.dumps({"type": "response_vote", "term": 3}),
        b"\x93\x01\x04\xa3abc",  # a string where an int belongs
        b"\x93\x01\x04\xff",  # a negative int
    ]
    for frame in bad:
        with pytest.raises(peer_codec.PeerCodecError):
            peer_codec.decode(frame)
    with pytest.raises(peer_codec.PeerCodecError):
        peer_codec.encode({"type": "apply_command", "command": b"x"})


def test_pre_shared_key_depends_on_the_group_and_the_password() -> None:
    a = pre_shared_key("password-one-1234", "G1")
    assert a == pre_shared_key("password-one-1234", "G1")
    assert a != pre_shared_key("password-one-1234", "G2") != pre_shared_key("password-two-1234", "G1")
    assert a != hashlib.sha256(b"password-one-1234").digest()


@pytest.mark.slow
async def test_a_300_mib_flood_at_the_leaders_peer_port_costs_nothing(group: InProcCluster) -> None:
    import resource

    leader, term = await _steady(group)
    host, _, port = _raft_address(leader).rpartition(":")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def flood() -> int:
        sent = 0
        chunk = os.urandom(1 << 20)
        while sent < 300 << 20:
            try:
                with socket.create_connection((host, int(port)), timeout=3) as s:
                    s.sendall(struct.pack(">I", 200) + b"\x00" * 200 + chunk)
                    sent += len(chunk)
                    while sent < 300 << 20:
                        s.sendall(chunk)
                        sent += len(chunk)
            except OSError:
                continue  # cut off: reconnect and go on
        return sent

    started = time.monotonic()
    sent = await _in_thread(flood)
    assert sent >= 300 << 20 and time.monotonic() - started < 120
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert rss_after - rss_before < 64 << 10, (rss_before, rss_after)  # KiB: nothing buffered
    await _still_leading(group, leader, term)


async def test_the_peer_password_changes_one_replica_at_a_time(tmp_path: Path) -> None:
    """Rolling change: step 1 every replica accepts the new password (current old, previous new);
    step 2 replicas switch one at a time (current new, previous old); links hold throughout."""
    old, new = PASSWORD, "the-new-peer-password-456"
    cluster = InProcCluster(str(tmp_path))
    cluster.per_node = {
        "n0": {"password": new, "password_previous": old},  # already switched
        "n1": {"password": old, "password_previous": new},  # step 1 only
        "n2": {"password": old, "password_previous": new},
    }
    await cluster.start()
    try:
        leader = await cluster.leader()
        await leader.append([b"mixed passwords"])
        for n in cluster.nodes.values():
            st = await n.status()
            if n is leader:
                assert all(p["connected"] for p in st["peers"].values()), st["peers"]
    finally:
        await cluster.stop()


async def test_a_replica_without_the_password_never_joins(tmp_path: Path) -> None:
    cluster = InProcCluster(str(tmp_path))
    cluster.per_node = {"n2": {"password": "a-password-nobody-else-has"}}
    await cluster.start()
    try:
        def two_agree() -> Any:
            leaders = [n for n in cluster.nodes.values() if n.role == "LEADER"]
            return leaders[0] if len(leaders) == 1 else None

        leader = await wait_until(two_agree, 10, "a leader of the two that share the password")
        assert leader.settings.self_id != "n2"
        await leader.append([b"two of three"])
        st = await cluster.nodes["n2"].status()
        assert not any(p["connected"] for p in st["peers"].values())
        await wait_until(  # the refused handshakes (attempts go on every connect retry)
            lambda: sum(n._sync.dl_transport.counters["handshake_failed"] for n in cluster.nodes.values()) > 0,
            10, "a refused handshake",
        )
    finally:
        await cluster.stop()


async def test_a_peer_name_that_does_not_resolve_never_stops_the_replica(group: InProcCluster) -> None:
    """Found by the compose drill: after ``docker kill`` of a replica its container name stops
    resolving, and the replicas that dial it died with ``socket.gaierror: Name or service not
    known`` raised on their tick thread (the group lost its quorum: no leader for 30 s). Lookups now
    run off the replica's thread and a failed one is retried."""
    leader, _term = await _steady(group)
    followers = sorted((n for n in group.nodes.values() if n is not leader), key=_raft_address)
    dead, alive = followers  # the lower address: the other follower (higher) dials it
    dead_addr = _raft_address(dead)
    await group.stop_node(dead.settings.self_id)
    for n in (leader, alive):
        def route_to_a_dead_name(n: Any = n) -> None:
            n._sync.dl_transport.connect_via[dead_addr] = "dead-replica.invalid:" + dead_addr.rpartition(":")[2]

        await n.run_on_replica_thread(route_to_a_dead_name, 5)
    await wait_until(  # the name looked up, failed, and looked up again (a retry), on the replica dialing it
        lambda: any(n._sync.dl_transport.resolver.failed_lookups >= 2 for n in (leader, alive)),
        10, "two failed lookups of the dead name",
    )
    for n in (leader, alive):
        assert n.fatal is None, "the replica failed"
    leader = await group.leader()
    await leader.append([b"two of three, one name gone"])
    resolver = leader._sync.dl_transport.resolver
    assert resolver.resolve("dead-replica.invalid", 1e9) is None


def test_the_resolver_answers_off_the_thread_and_retries_failures() -> None:
    from dledger.peer_tcp import PeerResolver

    answers = {"n1": ["10.0.0.7", "10.0.0.9"]}
    asked: list[str] = []

    def lookup(host: str) -> str:
        asked.append(host)
        if host not in answers:
            raise socket.gaierror(-2, "Name or service not known")
        return answers[host].pop(0) if len(answers[host]) > 1 else answers[host][0]

    r = PeerResolver(ttl_s=2.0, retry_s=0.5, lookup=lookup)
    try:
        assert r.resolve("127.0.0.3", 0.0) == "127.0.0.3" and not asked  # an address needs no lookup
        assert r.resolve("n1", 0.0) is None  # asked; not known yet
        wait_until_sync(lambda: r.resolve("n1", 0.1) == "10.0.0.7", 5, "the first answer", 0.01)
        assert r.resolve("n1", 1.0) == "10.0.0.7" and asked.count("n1") == 1  # cached within ttl
        assert r.resolve("n1", 2.5) == "10.0.0.7"  # stale while a fresh lookup runs
        wait_until_sync(lambda: r.resolve("n1", 2.6) == "10.0.0.9", 5, "a restarted container's new address", 0.01)
        assert r.resolve("gone", 0.0) is None
        wait_until_sync(lambda: "gone" in asked, 5, "the failed lookup", 0.01)
        n = asked.count("gone")
        assert r.resolve("gone", 0.2) is None and asked.count("gone") == n  # not before retry_s
        r.resolve("gone", 0.6)
        wait_until_sync(lambda: asked.count("gone") == n + 1, 5, "the retried lookup", 0.01)
    finally:
        r.close()
