"""Wire codec of the route records (``broker.protocol.routes``): records <-> plain dicts <-> msgpack
or JSON bytes (schema v1). The NameServer, the broker's registration client, the SDK and the tools
all encode and decode routes here.

Every request and response body is a map carrying ``"v": 1``; a body with another version is
refused with ``UNSUPPORTED_VERSION`` (a v2 peer must not be half-understood). Brokers talk msgpack
(``application/x-msgpack``); JSON (``application/json``) is accepted and answered too.
The codec checks shapes and types; the NameServer's rules on values (names, ports, roles) are
``namesrv.route_table.validate_*``, applied by the NameServer after decoding.

Decoding is total: any bytes either become a validated record or raise ``WireError`` /
``WireError`` (a ``ProtocolError``: a code and a message naming the field). No
KeyError, TypeError or RecursionError escapes. Unknown fields are errors, not ignored: a typo in a
field name must not silently fall back to a default (new fields come with a new version).

Map keys of ``broker_addrs`` are decimal strings ("0", "1"...) in both formats, as in RocketMQ's
JSON; the decoder also accepts integer keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar, cast

import msgpack

from broker.protocol.errors import ProtocolError
from broker.protocol.routes import (
    INT64_MAX,
    TOPICS_PER_REGISTRATION_MAX,
    WIRE_VERSION,
    BrokerData,
    BrokerRegistration,
    ClusterInfo,
    QueueData,
    RegisterResult,
    Role,
    TopicConfig,
    TopicRouteData,
    UnregisterRequest,
)

MSGPACK_TYPES: Final = ("application/x-msgpack", "application/msgpack", "application/vnd.msgpack")
MSGPACK_TYPE: Final = MSGPACK_TYPES[0]
JSON_TYPE: Final = "application/json"
Format = Literal["msgpack", "json"]
T = TypeVar("T")


class WireError(ProtocolError):
    """The body cannot be read as a v1 message: BAD_MSGPACK, BAD_JSON, BAD_REQUEST, MISSING_FIELD,
    BAD_FIELD_TYPE, UNKNOWN_FIELD, UNSUPPORTED_VERSION, UNSUPPORTED_MEDIA_TYPE."""


class UnsupportedMediaTypeError(WireError):
    """The Content-Type is neither msgpack nor JSON."""


@dataclass(frozen=True, slots=True)
class RegisterResponse:
    """The answer to a registration: the table's verdict plus the NameServer's wall clock."""

    result: RegisterResult
    namesrv_time_ms: int
    version: int = WIRE_VERSION


# -- bodies --------------------------------------------------------------------------------------
def format_for_content_type(content_type: str) -> Format:
    if content_type in MSGPACK_TYPES:
        return "msgpack"
    if content_type == JSON_TYPE:
        return "json"
    raise UnsupportedMediaTypeError(
        "UNSUPPORTED_MEDIA_TYPE",
        f"Content-Type must be {MSGPACK_TYPE} or {JSON_TYPE}, got {content_type!r:.80}",
    )


def parse_body(raw: bytes, fmt: Format) -> dict[str, Any]:
    """Bytes -> the top-level map of a v1 message (the version is checked here)."""
    if fmt == "msgpack":
        try:
            body = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises many types (ExtraData, StackError, ValueError ...)
            raise WireError("BAD_MSGPACK", f"body is not msgpack: {exc!s:.200}") from None
    else:
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise WireError("BAD_JSON", f"body is not JSON: {exc!s:.200}") from None
    if not isinstance(body, dict):
        raise WireError("BAD_REQUEST", f"body must be a map, got {type(body).__name__}")
    check_version(body)
    return cast(dict[str, Any], body)


def check_version(body: Mapping[Any, Any]) -> None:
    if "v" not in body:
        raise WireError("MISSING_FIELD", 'every message carries its schema version: "v": 1')
    v = body["v"]
    if isinstance(v, bool) or not isinstance(v, int):
        raise WireError("BAD_FIELD_TYPE", f"v must be an integer, got {v!r:.40}")
    if v != WIRE_VERSION:
        raise WireError(
            "UNSUPPORTED_VERSION", f"schema version {v} is not supported (this NameServer speaks v1)"
        )


def dump_body(body: Mapping[str, Any], fmt: Format) -> bytes:
    if fmt == "msgpack":
        return cast(bytes, msgpack.packb(body, use_bin_type=True))
    return json.dumps(body, separators=(",", ":")).encode()


# -- field reader --------------------------------------------------------------------------------
_MISSING: Any = object()


class _Fields:
    """Typed, total access to one decoded map; ``done()`` refuses fields nobody read."""

    def __init__(self, value: Any, path: str):
        if not isinstance(value, dict):
            raise WireError("BAD_FIELD_TYPE", f"{path or 'body'} must be a map, got {type(value).__name__}")
        self.d: dict[Any, Any] = value
        self.path = path
        self.used: set[str] = {"v"} if not path else set()

    def _name(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def _get(self, name: str, default: Any) -> Any:
        self.used.add(name)
        if name in self.d:
            return self.d[name]
        if default is _MISSING:
            raise WireError("MISSING_FIELD", f"{self._name(name)} is required")
        return default

    def _typed(self, name: str, default: Any, check: Callable[[Any], bool], what: str) -> Any:
        value = self._get(name, default)
        if value is not default and not check(value):
            raise WireError("BAD_FIELD_TYPE", f"{self._name(name)} must be {what}, got {_kind(value)}")
        return value

    def text(self, name: str, default: Any = _MISSING) -> Any:
        return self._typed(name, default, lambda x: isinstance(x, str), "a string")

    def integer(self, name: str, default: Any = _MISSING) -> Any:
        return self._typed(name, default, _is_int64, "a 64-bit integer")

    def flag(self, name: str, default: Any = _MISSING) -> Any:
        return self._typed(name, default, lambda x: isinstance(x, bool), "a boolean")

    def array(self, name: str, default: Any = _MISSING) -> Any:
        return self._typed(name, default, lambda x: isinstance(x, list), "an array")

    def mapping(self, name: str, default: Any = _MISSING) -> Any:
        return self._typed(name, default, lambda x: isinstance(x, dict), "a map")

    def optional_integer(self, name: str) -> int | None:
        value = self._get(name, None)
        if value is not None and not _is_int64(value):
            raise WireError(
                "BAD_FIELD_TYPE", f"{self._name(name)} must be a 64-bit integer or null, got {_kind(value)}"
            )
        return cast(int | None, value)

    def optional_text(self, name: str) -> str | None:
        value = self._get(name, None)
        if value is not None and not isinstance(value, str):
            raise WireError(
                "BAD_FIELD_TYPE", f"{self._name(name)} must be a string or null, got {_kind(value)}"
            )
        return value

    def done(self) -> None:
        unknown = sorted(repr(k) if not isinstance(k, str) else k for k in self.d.keys() - self.used)
        if unknown:
            raise WireError(
                "UNKNOWN_FIELD", f"unknown field(s) in {self.path or 'body'}: {', '.join(unknown[:5])}"
            )


def _is_int64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -INT64_MAX - 1 <= value <= INT64_MAX


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _list_of(items: list[Any], path: str, decode: Callable[[_Fields], T]) -> tuple[T, ...]:
    out = []
    for i, item in enumerate(items):
        fields = _Fields(item, f"{path}[{i}]")
        out.append(decode(fields))
        fields.done()
    return tuple(out)


def _decode(body: Any, decode: Callable[[_Fields], T]) -> T:
    fields = _Fields(body, "")
    check_version(fields.d)
    record = decode(fields)
    fields.done()
    return record


# -- topic config, registration, unregister -------------------------------------------------------
def topic_config_to_dict(tc: TopicConfig) -> dict[str, Any]:
    return tc.to_dict()


def _topic_config(f: _Fields) -> TopicConfig:
    return TopicConfig(
        topic=f.text("topic"),
        read_queue_nums=f.integer("read_queue_nums", 4),
        write_queue_nums=f.integer("write_queue_nums", 4),
        perm=f.integer("perm", 6),
        order=f.flag("order", False),
    )


def registration_to_dict(reg: BrokerRegistration) -> dict[str, Any]:
    return {
        "v": reg.version,
        "cluster": reg.cluster,
        "broker_name": reg.broker_name,
        "broker_id": reg.broker_id,
        "address": reg.address,
        "role": reg.role,
        "term": reg.term,
        "topics": [topic_config_to_dict(tc) for tc in reg.topics],
        "data_version": reg.data_version,
        "heartbeat_timeout_ms": reg.heartbeat_timeout_ms,
        **({"remoting_address": reg.remoting_address} if reg.remoting_address is not None else {}),
        # Only when set: a NameServer of a previous release refuses fields it does not know.
        **({"cluster_id": reg.cluster_id} if reg.cluster_id is not None else {}),
    }


def registration_from_dict(body: Any) -> BrokerRegistration:
    """A registration of the right shape (the NameServer then applies ``validate_registration``)."""

    def decode(f: _Fields) -> BrokerRegistration:
        return BrokerRegistration(
            cluster=f.text("cluster"),
            broker_name=f.text("broker_name"),
            broker_id=f.integer("broker_id"),
            address=f.text("address"),
            role=cast(Role, f.text("role")),  # its value is checked by validate_registration
            term=f.integer("term"),
            topics=_list_of(
                _bounded(f.array("topics", []), TOPICS_PER_REGISTRATION_MAX), "topics", _topic_config
            ),
            data_version=f.integer("data_version", 0),
            heartbeat_timeout_ms=f.optional_integer("heartbeat_timeout_ms"),
            remoting_address=f.optional_text("remoting_address"),
            cluster_id=f.optional_text("cluster_id"),
        )

    return _decode(body, decode)


def unregister_to_dict(req: UnregisterRequest) -> dict[str, Any]:
    return {"v": req.version, "cluster": req.cluster, "broker_name": req.broker_name, "address": req.address}


def unregister_from_dict(body: Any) -> UnregisterRequest:
    def decode(f: _Fields) -> UnregisterRequest:
        return UnregisterRequest(f.text("cluster"), f.text("broker_name"), f.text("address"))

    return _decode(body, decode)


# -- responses -----------------------------------------------------------------------------------
def register_response_to_dict(resp: RegisterResponse) -> dict[str, Any]:
    r = resp.result
    return {
        "v": resp.version,
        "accepted": r.accepted,
        "changed": r.changed,
        "ignored_reason": r.ignored_reason,
        "leader_address": r.leader_address,
        "leader_term": r.leader_term,
        "changes": list(r.changes),
        "namesrv_time_ms": resp.namesrv_time_ms,
    }


def register_response_from_dict(body: Any) -> RegisterResponse:
    def decode(f: _Fields) -> RegisterResponse:
        result = RegisterResult(
            accepted=f.flag("accepted"),
            changed=f.flag("changed"),
            leader_address=f.optional_text("leader_address"),
            leader_term=f.integer("leader_term"),
            changes=tuple(_strings(f.array("changes", []), "changes")),
            ignored_reason=f.optional_text("ignored_reason"),
        )
        return RegisterResponse(result, f.integer("namesrv_time_ms"))

    return _decode(body, decode)


def broker_data_to_dict(bd: BrokerData) -> dict[str, Any]:
    return {
        "cluster": bd.cluster,
        "broker_name": bd.broker_name,
        "broker_addrs": {str(bid): addr for bid, addr in sorted(bd.broker_addrs.items())},
        **({"remoting_addrs": {str(bid): a for bid, a in sorted(bd.remoting_addrs.items())}}
           if bd.remoting_addrs else {}),
    }


def _broker_data(f: _Fields) -> BrokerData:
    raw = f.mapping("broker_addrs")
    addrs: dict[int, str] = {}
    for key, addr in raw.items():
        bid = _broker_id_key(key)
        if bid is None or not isinstance(addr, str):
            raise WireError("BAD_FIELD_TYPE", f"{f.path}.broker_addrs must map broker ids to address strings")
        addrs[bid] = addr
    remoting: dict[int, str] = {}
    for key, addr in f.mapping("remoting_addrs", {}).items():
        bid = _broker_id_key(key)
        if bid is None or not isinstance(addr, str):
            raise WireError("BAD_FIELD_TYPE", f"{f.path}.remoting_addrs must map broker ids to address strings")
        remoting[bid] = addr
    return BrokerData(f.text("cluster"), f.text("broker_name"), addrs, remoting)


def _broker_id_key(key: Any) -> int | None:
    """A broker id map key: an integer, or its decimal string (JSON keys are strings)."""
    if _is_int64(key):
        return cast(int, key)
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 18:
        return int(key)
    return None


def topic_route_to_dict(route: TopicRouteData) -> dict[str, Any]:
    return {
        "v": route.version,
        "topic": route.topic,
        "order": route.order,
        "queue_datas": [
            {
                "broker_name": q.broker_name,
                "read_queue_nums": q.read_queue_nums,
                "write_queue_nums": q.write_queue_nums,
                "perm": q.perm,
            }
            for q in route.queue_datas
        ],
        "broker_datas": [broker_data_to_dict(b) for b in route.broker_datas],
    }


def topic_route_from_dict(body: Any) -> TopicRouteData:
    def queue_data(f: _Fields) -> QueueData:
        return QueueData(
            f.text("broker_name"),
            f.integer("read_queue_nums"),
            f.integer("write_queue_nums"),
            f.integer("perm"),
        )

    def decode(f: _Fields) -> TopicRouteData:
        return TopicRouteData(
            topic=f.text("topic"),
            queue_datas=_list_of(f.array("queue_datas"), "queue_datas", queue_data),
            broker_datas=_list_of(f.array("broker_datas"), "broker_datas", _broker_data),
            order=f.flag("order", False),
        )

    return _decode(body, decode)


def cluster_info_to_dict(info: ClusterInfo) -> dict[str, Any]:
    return {
        "v": info.version,
        "clusters": {c: list(names) for c, names in info.clusters.items()},
        "brokers": {name: broker_data_to_dict(bd) for name, bd in info.brokers.items()},
    }


def cluster_info_from_dict(body: Any) -> ClusterInfo:
    def decode(f: _Fields) -> ClusterInfo:
        clusters: dict[str, tuple[str, ...]] = {}
        for cluster, names in f.mapping("clusters").items():
            if not isinstance(names, list):
                raise WireError("BAD_FIELD_TYPE", f"clusters.{cluster} must be an array of broker names")
            clusters[str(cluster)] = tuple(_strings(names, f"clusters.{cluster}"))
        brokers = {}
        for name, item in f.mapping("brokers").items():
            fields = _Fields(item, f"brokers.{name}")
            brokers[str(name)] = _broker_data(fields)
            fields.done()
        return ClusterInfo(clusters, brokers)

    return _decode(body, decode)


def topic_list_to_dict(topics: tuple[str, ...]) -> dict[str, Any]:
    return {"v": WIRE_VERSION, "topics": list(topics)}


def topic_list_from_dict(body: Any) -> tuple[str, ...]:
    return _decode(body, lambda f: tuple(_strings(f.array("topics"), "topics")))


def error_to_dict(code: str, message: str) -> dict[str, Any]:
    return {"v": WIRE_VERSION, "code": code, "message": message}


def _bounded(items: list[Any], items_max: int) -> list[Any]:
    """Refuse an over-long list before decoding its items."""
    if len(items) > items_max:
        raise WireError("TOO_MANY_TOPICS", f"at most {items_max} topics per registration")
    return items


def _strings(items: list[Any], path: str) -> list[str]:
    if not all(isinstance(x, str) for x in items):
        raise WireError("BAD_FIELD_TYPE", f"{path} must hold strings only")
    return items
