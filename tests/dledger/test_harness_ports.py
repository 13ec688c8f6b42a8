"""The tests' port allocator hands out ports the kernel never gives to a port-0 bind or an outgoing
connection: a broker restarted in a test could not bind its raft port again when another broker's
port-0 listener (the binary protocol) had been given that number meanwhile (BindError, seen in
tests/broker/test_regressions.py)."""

from __future__ import annotations

import socket

from tests.dledger.harness import HOST, free_ports


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        lo, hi = (int(x) for x in f.read().split())
    ports = free_ports(40)
    assert len(set(ports)) == 40
    assert not any(lo <= p <= hi for p in ports), [p for p in ports if lo <= p <= hi]
    for p in ports:
        with socket.socket() as s:
            s.bind((HOST, p))
