"""A small RocketMQ remoting client for tests, built on our codec (``broker.protocol.rocketmq``) the way
the official clients behave: many requests in flight on one connection, answers matched by opaque,
requests from the server queued for the test to answer, optional ``AclClientRPCHook`` signing."""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import Mapping
from typing import Any

from broker.protocol.rocketmq import acl
from broker.protocol.rocketmq import command as rc
from broker.protocol.rocketmq.codes import SerializeType
from broker.protocol.rocketmq.command import FrameDecoder, RemotingCommand
from broker.protocol.rocketmq.errors import RemotingError


class RmqClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 credentials: tuple[str, str] | None = None, serialize_type: SerializeType = SerializeType.JSON):
        self.reader = reader
        self.writer = writer
        self.credentials = credentials
        self.serialize_type = serialize_type
        self.server_requests: asyncio.Queue[RemotingCommand] = asyncio.Queue()
        self._opaques = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[RemotingCommand]] = {}
        self.closed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, addr: str, *, ssl_context: ssl.SSLContext | None = None, **kw: Any) -> RmqClient:
        host, _, port = addr.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port), ssl=ssl_context,
                                                       server_hostname=host if ssl_context else None)
        return cls(reader, writer, **kw)

    async def _read(self) -> None:
        decoder = FrameDecoder()
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    return
                decoder.feed(data)
                while (cmd := decoder.next()) is not None:
                    if cmd.is_response:
                        fut = self._waiting.pop(cmd.opaque, None)
                        if fut is not None and not fut.done():
                            fut.set_result(cmd)
                    else:
                        self.server_requests.put_nowait(cmd)
        except (ConnectionError, RemotingError, OSError):
            return
        finally:
            self.closed.set()
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("closed by the server"))

    def build(self, code: int, ext: Mapping[str, str] | None = None, body: bytes = b"", *, oneway: bool = False,
              opaque: int | None = None, version: int = rc.VERSION_V4_9_8) -> RemotingCommand:
        fields = dict(ext) if ext is not None else None
        if self.credentials is not None:
            fields = acl.sign_request(fields or {}, body, *self.credentials)
        return rc.request(code, next(self._opaques) if opaque is None else opaque, fields, body, oneway=oneway,
                          serialize_type=self.serialize_type, version=version)

    async def send(self, cmd: RemotingCommand) -> asyncio.Future[RemotingCommand] | None:
        fut = None
        if not cmd.is_oneway:
            fut = asyncio.get_running_loop().create_future()
            self._waiting[cmd.opaque] = fut
        self.writer.write(rc.encode(cmd))
        await self.writer.drain()
        return fut

    async def call(self, code: int, ext: Mapping[str, str] | None = None, body: bytes = b"", *,
                   timeout_s: float = 10.0, **kw: Any) -> RemotingCommand:
        fut = await self.send(self.build(code, ext, body, **kw))
        assert fut is not None
        async with asyncio.timeout(timeout_s):
            return await fut

    async def oneway(self, code: int, ext: Mapping[str, str] | None = None, body: bytes = b"") -> None:
        await self.send(self.build(code, ext, body, oneway=True))

    async def reply(self, request: RemotingCommand, code: int = 0, remark: str | None = None,
                    ext: Mapping[str, str] | None = None, body: bytes = b"") -> None:
        self.writer.write(rc.encode(rc.response_to(request, code, remark, ext, body)))
        await self.writer.drain()

    async def wait_closed(self, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            await self.closed.wait()

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError, ssl.SSLError):
            pass
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
