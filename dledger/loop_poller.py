"""pysyncobj's poller, played by the event loop: the replica's sockets are watched by the loop that
serves its clients.

pysyncobj (and our transport, ``peer_tcp``) register descriptors with ``subscribe(fd, callback,
mask)`` and expect ``poll(timeout)`` to wait for them and call back. Here ``subscribe`` maps onto
``loop.add_reader`` / ``add_writer`` (only when the mask changes: a transport re-subscribes on
every send), and the loop calls back when a descriptor is ready; ``poll`` does nothing (the loop
polls). Every callback runs inside ``enter`` (the replica's clock) and is followed by
``after_input`` (a tick soon, once per loop turn) unless it returns True (a quiet read: the
transport handed over only messages that moved nothing a light tick reads, such as a leader's
success answer that lets no commit advance), and an exception that escapes it is handed to
``fail`` (the replica fails stop) instead of the loop's exception handler.

``read_pending()`` reads input that is already there, without waiting: a follower whose election
timer expired reads its sockets first (the leader's heartbeat may wait there, after the loop was
blocked), so the tick does not campaign against a leader it just has not heard yet.

Owner: the replica's loop thread; nothing here is thread-safe, nothing needs to be.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable
from typing import Any

from pysyncobj.poller import POLL_EVENT_TYPE

_READ = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR  # the loop reports errors as readable
_WRITE = POLL_EVENT_TYPE.WRITE

Callback = Callable[[int, int], bool | None]


class LoopPoller:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        enter: Callable[[], None],
        after_input: Callable[[], None],
        fail: Callable[[BaseException], None],
    ):
        self._loop = loop
        self._enter = enter
        self._after_input = after_input
        self._fail = fail
        self._subs: dict[int, tuple[Callback, int]] = {}  # fd -> (callback, mask watched)
        self.drains: list[Callable[[], Any]] = []  # in-process inboxes, read by read_pending too

    # -- pysyncobj's Poller --------------------------------------------------------------------
    def subscribe(self, descr: int, callback: Callback, eventMask: int) -> None:
        old = self._subs.get(descr)
        old_mask = old[1] if old is not None else 0
        self._subs[descr] = (callback, eventMask)
        loop = self._loop
        if eventMask & _READ and not old_mask & _READ:
            loop.add_reader(descr, self._ready, descr, POLL_EVENT_TYPE.READ)
        elif old_mask & _READ and not eventMask & _READ:
            loop.remove_reader(descr)
        if eventMask & _WRITE and not old_mask & _WRITE:
            loop.add_writer(descr, self._ready, descr, POLL_EVENT_TYPE.WRITE)
        elif old_mask & _WRITE and not eventMask & _WRITE:
            loop.remove_writer(descr)

    def unsubscribe(self, descr: int) -> None:
        old = self._subs.pop(descr, None)
        if old is None:
            return
        if old[1] & _READ:
            self._loop.remove_reader(descr)
        if old[1] & _WRITE:
            self._loop.remove_writer(descr)

    def poll(self, timeout: float) -> None:
        """The loop polls; a tick never waits here."""

    # -- dispatch --------------------------------------------------------------------------------
    def _ready(self, descr: int, event: int) -> None:
        entry = self._subs.get(descr)
        if entry is None:
            return
        self._enter()
        try:
            quiet = entry[0](descr, event)
        except BaseException as exc:
            self._fail(exc)
            return
        if quiet is not True:  # True: nothing a light tick reads moved (peer_tcp's quiet reads)
            self._after_input()

    def read_pending(self) -> None:
        """Hand over input that already arrived (sockets, in-process inboxes), without waiting."""
        for drain in self.drains:
            drain()
        readable = [fd for fd, (_cb, mask) in self._subs.items() if mask & _READ]
        if not readable:
            return
        p = select.poll()
        for fd in readable:
            p.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        for fd, _ev in p.poll(0):
            entry = self._subs.get(fd)
            if entry is not None:
                entry[0](fd, POLL_EVENT_TYPE.READ)

    def close(self) -> None:
        for descr in list(self._subs):
            self.unsubscribe(descr)
