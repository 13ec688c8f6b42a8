"""Command-line arguments the tools share (one definition each): the NameServer list, and the
private local cluster the failover and stability benchmarks start."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from broker.client.transport import DEFAULT_NAMESRV

Positive = Callable[..., Callable[[str], Any]]  # mq-bench's ``_positive(kind, hi)`` argument type


def add_namesrv_argument(p: argparse.ArgumentParser) -> None:
    """``-n/--namesrvAddr`` into ``args.namesrv`` (None: ``$NAMESRV_ADDR``, else the default)."""
    p.add_argument(
        "-n",
        "--namesrvAddr",
        dest="namesrv",
        default=None,
        help=f"NameServer list 'a:9876;b:9877' (default: $NAMESRV_ADDR, else {DEFAULT_NAMESRV})",
    )


def add_local_cluster_arguments(
    p: argparse.ArgumentParser, positive: Positive, *, topic: str, raft_port: int, http_port: int, namesrv_port: int
) -> None:
    """Where a benchmark's private local cluster lives and listens, its topic, ``--json``."""
    p.add_argument("-t", "--topic", default=topic)
    p.add_argument("--dir", default=None, help="cluster directory (default: a new temporary one)")
    p.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    p.add_argument("--raft-port", dest="raft_port", type=positive(int, 65000), default=raft_port)
    p.add_argument("--http-port", dest="http_port", type=positive(int, 65000), default=http_port)
    p.add_argument("--namesrv-port", dest="namesrv_port", type=positive(int, 65000), default=namesrv_port)
    p.add_argument("--json", action="store_true")
