"""HTTP body codec of the broker API: msgpack or JSON in, the same (or what Accept asks) out.

Errors are ``{code, message}`` maps (``error``). JSON answers cannot carry
bytes: message bodies go out base64-encoded as ``body_b64``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import msgpack
from aiohttp import web

from broker.protocol.errors import ProtocolError
from broker.serving.http_edge import request_body

MSGPACK_TYPES = ("application/x-msgpack", "application/msgpack", "application/vnd.msgpack")
MSGPACK = MSGPACK_TYPES[0]


def wants_msgpack(request: web.Request) -> bool:
    if request.content_type in MSGPACK_TYPES:
        return True
    accept = request.headers.get("Accept", "")
    return any(t in accept for t in MSGPACK_TYPES)


async def read_body(request: web.Request, *, binary: bool = False) -> dict[str, Any]:
    """The request's map; ``binary`` endpoints (send) take msgpack only."""
    raw = await request_body(request)
    ctype = request.content_type
    if ctype in MSGPACK_TYPES:
        try:
            value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:
            raise ProtocolError("BAD_MSGPACK", f"request body is not msgpack: {str(exc)[:120]}", 400) from None
    elif ctype == "application/json" and not binary:
        try:
            value = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ProtocolError("BAD_JSON", f"request body is not JSON: {str(exc)[:120]}", 400) from None
    else:
        allowed = MSGPACK if binary else f"{MSGPACK} or application/json"
        raise ProtocolError("UNSUPPORTED_MEDIA_TYPE", f"Content-Type must be {allowed}, got {ctype!r:.80}", 415)
    if not isinstance(value, dict):
        raise ProtocolError("BAD_REQUEST", "the request body must be a map", 400)
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(v, (bytes, bytearray)):
                out[f"{k}_b64"] = base64.b64encode(v).decode("ascii")
            else:
                out[str(k)] = _jsonable(v)
        return out
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def answer(request: web.Request, obj: Any, status: int = 200) -> web.Response:
    if wants_msgpack(request):
        return web.Response(body=msgpack.packb(obj, use_bin_type=True), status=status, content_type=MSGPACK)
    return web.Response(text=json.dumps(_jsonable(obj)), status=status, content_type="application/json")


def error(request: web.Request, status: int, code: str, message: str, **extra: Any) -> web.Response:
    return answer(request, {"code": code, "message": message, **extra}, status)
