"""The data source's options: parsed once, on the driver, into one frozen ``SourceOptions``.

Functions over the option strings Spark hands over (keys are case-insensitive, values are
strings); the only I/O is reading the credentials and CA files and the environment named below.
Every mistake is a ``SourceOptionError`` naming the option and what was expected: an
unknown option (a typo such as ``startingOffset``) is an error too, never silently ignored.

| option | default | meaning |
|---|---|---|
| namesrv | env NAMESRV_ADDR, else 127.0.0.1:9876 | NameServers, ``a:9876;b:9877`` (``,`` works too) |
| topic / topics | required (one of them) | one topic, or several separated by ``,`` |
| startingOffsets | batch ``earliest``, stream ``latest`` | ``earliest``, ``latest`` or JSON offsets |
| endingOffsets | ``latest`` (batch only) | ``latest`` or JSON offsets |
| startingTimestamp, endingTimestamp | | ms since the epoch, for every queue |
| startingOffsetsByTimestamp, endingOffsetsByTimestamp | | JSON of ms per queue |
| filter | everything | ``tag:A||B`` (``tag:*`` = everything) or ``sql:<SQL92 condition>`` (filtered by the brokers) |
| maxRecordsPerTrigger | no limit | queue offsets per micro-batch, over all queues |
| maxRecordsPerPartition | 100000 | a queue's range is split into partitions of at most this many offsets |
| failOnDataLoss | true | fail when retention removed offsets asked for; ``false``: skip and report |
| dataLossLog | | a file that gets one JSON line per skipped range (besides the log warning) |
| preferFollowers | true | read from followers first, the leader last |
| pullBatchSize | 1024 | messages per pull request (1..1024) |
| timeoutMs | 30000 | how long a range may go without any replica answering before the task fails |
| accessKey + secretKey, or credentialsFile | env, see below | ACL credentials: every request is signed with them |
| tls | env ``DLEDGER_TLS``, else false | ``true``: HTTPS to NameServers and brokers, trusting the system's CAs |
| tlsCaFile | env ``DLEDGER_TLS_CA_FILE`` | HTTPS, trusting this CA (PEM) only |

Credentials and TLS (``security``): ``credentialsFile`` is RocketMQ's ``tools.yml`` shape
(``accessKey:`` and ``secretKey:``), read with ``broker.protocol.auth.load_credentials`` (refused when
group or others may read it). Without a credentials option the SDK's environment rules apply:
``DLEDGER_ACCESS_KEY`` + ``DLEDGER_SECRET_KEY``, else ``DLEDGER_CREDENTIALS_FILE``; without a TLS
option, ``DLEDGER_TLS_CA_FILE``, else ``DLEDGER_TLS``. All of it is resolved here, on the driver
(the environment is the driver's), and carried to the tasks as ``SourceSecurity``.

JSON offsets are keyed by topic, broker group and queue id; ``-2`` means earliest and ``-1``
latest (Kafka's convention)::

    {"TopicA": {"RaftNode00": {"0": 23, "1": -2}, "RaftNode01": {"0": -1}}}
"""

from __future__ import annotations

import dataclasses
import json
import os
import ssl
from collections.abc import Mapping
from typing import Literal

from broker.client.message import MessageQueue, parse_tags_expression
from broker.client.transport import ENV_TLS, ENV_TLS_CA_FILE, ClientError, parse_addrs
from broker.protocol.auth import Credentials, CredentialsError, credentials_from_env, load_credentials
from broker.protocol.limits import PULL_COUNT_MAX
from broker.protocol.names import is_topic
from broker.protocol.sql_filter import SqlFilterError, compile_filter
from spark_jobs.source.security import SourceSecurity, ssl_context_from_pem

EARLIEST = -2
LATEST = -1
MAX_RECORDS_PER_PARTITION_DEFAULT = 100_000
TIMEOUT_MS_DEFAULT = 30_000
OFFSET_MAX = 2**63 - 1
CA_FILE_BYTES_MAX = 1 << 20  # a CA bundle (the system's is ~200 KiB)

Mode = Literal["batch", "stream"]
SpecKind = Literal["earliest", "latest", "offsets", "timestamp", "timestamps"]

KNOWN_OPTIONS = {
    k.lower(): k
    for k in (
        "namesrv",
        "topic",
        "topics",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "endingTimestamp",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
        "filter",
        "maxRecordsPerTrigger",
        "maxRecordsPerPartition",
        "failOnDataLoss",
        "dataLossLog",
        "preferFollowers",
        "pullBatchSize",
        "timeoutMs",
        "accessKey",
        "secretKey",
        "credentialsFile",
        "tls",
        "tlsCaFile",
    )
}


class SourceOptionError(ValueError):
    """A bad option of the ``dledger-mq`` data source: the message names it and what it takes."""


@dataclasses.dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts (or ends) in every queue.

    - ``earliest`` / ``latest``: each queue's first retained / next offset;
    - ``offsets``: ``per_queue`` holds an offset (or EARLIEST / LATEST) for every queue;
    - ``timestamp``: the first offset stored at or after ``ts_ms``, in every queue;
    - ``timestamps``: ``per_queue`` holds a time in ms (or EARLIEST / LATEST) per queue.
    """

    kind: SpecKind
    ts_ms: int | None = None
    per_queue: tuple[tuple[MessageQueue, int], ...] = ()

    def queue_map(self) -> dict[MessageQueue, int]:
        return dict(self.per_queue)


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    mode: Mode
    namesrv: tuple[str, ...]
    topics: tuple[str, ...]
    starting: OffsetSpec
    ending: OffsetSpec
    tags: frozenset[str] | None  # None: every message
    max_records_per_trigger: int | None
    max_records_per_partition: int
    fail_on_data_loss: bool
    data_loss_log: str | None
    prefer_followers: bool
    pull_batch_size: int
    timeout_ms: int
    security: SourceSecurity
    sql: str | None = None  # an SQL92 filter (the brokers evaluate it); None: by tags only

    @property
    def tags_expression(self) -> str:
        return "*" if self.tags is None else "||".join(sorted(self.tags))

    @property
    def filtered(self) -> bool:
        """Whether the brokers skip non-matching messages (a skipped offset is then served)."""
        return self.tags is not None or self.sql is not None


def parse_options(raw: Mapping[str, str], mode: Mode, env: Mapping[str, str] | None = None) -> SourceOptions:
    """Every option checked; ``mode`` decides the defaults and which options are allowed; ``env``
    (default: ``os.environ``) is consulted for credentials and TLS the options do not give."""
    opts = {str(k).lower(): str(v) for k, v in raw.items()}
    unknown = sorted(set(opts) - set(KNOWN_OPTIONS))
    if unknown:
        raise SourceOptionError(
            f"unknown option(s) {', '.join(unknown)} for dledger-mq; known: {', '.join(sorted(KNOWN_OPTIONS.values()))}"
        )
    topics = _topics(opts)
    starting = _spec(opts, "starting", mode, topics)
    ending = _spec(opts, "ending", mode, topics)
    if mode == "stream" and ending.kind != "latest":
        raise SourceOptionError("endingOffsets/endingTimestamp/endingOffsetsByTimestamp are for batch reads only")
    max_per_trigger = _int_optional(opts, "maxRecordsPerTrigger", 1, OFFSET_MAX)
    if mode == "batch" and max_per_trigger is not None:
        raise SourceOptionError("maxRecordsPerTrigger applies to streaming reads only")
    try:
        namesrv = tuple(parse_addrs(opts.get("namesrv")))
    except ValueError as exc:
        raise SourceOptionError(f"namesrv: {exc}") from None
    log_path = opts.get("datalosslog") or None
    return SourceOptions(
        mode=mode,
        namesrv=namesrv,
        topics=topics,
        starting=starting,
        ending=ending,
        tags=parse_filter(opts.get("filter")),
        max_records_per_trigger=max_per_trigger,
        max_records_per_partition=_int(
            opts, "maxRecordsPerPartition", MAX_RECORDS_PER_PARTITION_DEFAULT, 1, OFFSET_MAX
        ),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        data_loss_log=log_path,
        prefer_followers=_bool(opts, "preferFollowers", True),
        pull_batch_size=_int(opts, "pullBatchSize", PULL_COUNT_MAX, 1, PULL_COUNT_MAX),
        timeout_ms=_int(opts, "timeoutMs", TIMEOUT_MS_DEFAULT, 100, 3_600_000),
        security=parse_security(opts, os.environ if env is None else env),
        sql=parse_sql_filter(opts.get("filter")),
    )


def parse_filter(expr: str | None) -> frozenset[str] | None:
    """``tag:A||B`` → {A, B}; ``tag:*``, empty, absent or an SQL filter → None (every tag)."""
    if expr is None or not expr.strip():
        return None
    kind, sep, rest = expr.strip().partition(":")
    kind = kind.strip().lower()
    if sep and kind == "tag":
        try:
            return parse_tags_expression(rest)
        except ClientError as exc:
            raise SourceOptionError(f"filter {expr!r}: {exc.message}") from None
    if sep and kind == "sql":
        return None
    raise SourceOptionError(f"filter {expr!r}: expected 'tag:<tag>[||<tag>...]', 'tag:*' or 'sql:<condition>'")


def parse_sql_filter(expr: str | None) -> str | None:
    """``sql:<condition>`` → the condition, checked here (the error names its position); else None."""
    if expr is None:
        return None
    kind, sep, rest = expr.strip().partition(":")
    if not sep or kind.strip().lower() != "sql":
        return None
    try:
        compile_filter(rest)
    except SqlFilterError as exc:
        raise SourceOptionError(f"filter {expr[:200]!r}: {exc}") from None
    return rest


def _topics(opts: Mapping[str, str]) -> tuple[str, ...]:
    if "topic" in opts and "topics" in opts:
        raise SourceOptionError("give either topic or topics, not both")
    raw = opts.get("topic", opts.get("topics"))
    if raw is None:
        raise SourceOptionError("option topic (or topics: A,B) is required")
    names = [t.strip() for t in raw.split(",") if t.strip()]
    if not names:
        raise SourceOptionError("topic names no topic")
    for t in names:
        if not is_topic(t):
            raise SourceOptionError(f"topic {t!r} must match [%|a-zA-Z0-9_-]{{1,127}}")
    if len(set(names)) != len(names):
        raise SourceOptionError(f"topics {raw!r} names a topic twice")
    return tuple(names)


def _spec(
    opts: Mapping[str, str], which: Literal["starting", "ending"], mode: Mode, topics: tuple[str, ...]
) -> OffsetSpec:
    keys = {
        f"{which}offsets": "offsets",
        f"{which}timestamp": "timestamp",
        f"{which}offsetsbytimestamp": "timestamps",
    }
    given = [k for k in keys if k in opts]
    if len(given) > 1:
        raise SourceOptionError(f"give at most one of {', '.join(KNOWN_OPTIONS[k] for k in given)}")
    if not given:
        return OffsetSpec("earliest" if which == "starting" and mode == "batch" else "latest")
    key = given[0]
    name = KNOWN_OPTIONS[key]
    value = opts[key].strip()
    if keys[key] == "timestamp":
        return OffsetSpec("timestamp", ts_ms=_ms(value, name))
    if keys[key] == "offsets" and value.lower() == "earliest":
        if which == "ending":
            raise SourceOptionError("endingOffsets=earliest reads nothing: use latest or JSON offsets")
        return OffsetSpec("earliest")
    if keys[key] == "offsets" and value.lower() == "latest":
        return OffsetSpec("latest")
    per_queue = parse_offsets_json(value, name, topics)
    kind: SpecKind = "offsets" if keys[key] == "offsets" else "timestamps"
    if which == "ending" and any(v == EARLIEST for _, v in per_queue):
        raise SourceOptionError(f"{name}: -2 (earliest) is not an ending offset")
    return OffsetSpec(kind, per_queue=per_queue)


def parse_offsets_json(text: str, name: str, topics: tuple[str, ...]) -> tuple[tuple[MessageQueue, int], ...]:
    """``{"topic": {"broker": {"queue id": n}}}`` → sorted ((queue, n), ...); n ≥ 0, -2 or -1."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceOptionError(
            f"{name}: not 'earliest', 'latest' or JSON like "
            f'{{"TopicA": {{"RaftNode00": {{"0": 23, "1": -2}}}}}} ({exc.msg})'
        ) from None
    if not isinstance(doc, dict) or not doc:
        raise SourceOptionError(f"{name}: expected a JSON object keyed by topic")
    out: dict[MessageQueue, int] = {}
    for topic, brokers in doc.items():
        if topic not in topics:
            raise SourceOptionError(f"{name}: topic {topic!r} is not one of the topics read ({', '.join(topics)})")
        if not isinstance(brokers, dict) or not brokers:
            raise SourceOptionError(f"{name}: {topic!r} must map broker names to {{queue id: offset}}")
        for broker, queues in brokers.items():
            if not isinstance(queues, dict) or not queues:
                raise SourceOptionError(f"{name}: {topic}/{broker} must map queue ids to offsets")
            for qid, value in queues.items():
                if not (isinstance(qid, str) and qid.isdigit() and int(qid) < 1024):
                    raise SourceOptionError(f"{name}: queue id {qid!r} of {topic}/{broker} is not 0..1023")
                if isinstance(value, bool) or not isinstance(value, int) or not (value >= 0 or value in (-1, -2)):
                    raise SourceOptionError(
                        f"{name}: {topic}/{broker}/{qid} must be an integer >= 0, -2 (earliest) or -1 (latest)"
                    )
                if value > OFFSET_MAX:
                    raise SourceOptionError(f"{name}: {topic}/{broker}/{qid} is out of range")
                out[MessageQueue(topic, broker, int(qid))] = value
    return tuple(sorted(out.items()))


def offsets_to_json(offsets: Mapping[MessageQueue, int]) -> dict[str, dict[str, dict[str, int]]]:
    """The nested, sorted dict Spark checkpoints (same input, same JSON text)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for mq in sorted(offsets):
        out.setdefault(mq.topic, {}).setdefault(mq.broker_name, {})[str(mq.queue_id)] = int(offsets[mq])
    return out


def offsets_from_json(doc: object) -> dict[MessageQueue, int]:
    """The inverse of ``offsets_to_json`` (what Spark hands back from a checkpoint)."""
    if not isinstance(doc, dict):
        raise SourceOptionError(f"offsets {doc!r} are not a JSON object")
    out: dict[MessageQueue, int] = {}
    for topic, brokers in doc.items():
        for broker, queues in dict(brokers).items():
            for qid, value in dict(queues).items():
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise SourceOptionError(f"offset {topic}/{broker}/{qid}={value!r} is not an offset")
                out[MessageQueue(str(topic), str(broker), int(qid))] = value
    return out


def _ms(value: str, name: str) -> int:
    if not value.isdigit() or int(value) > OFFSET_MAX:
        raise SourceOptionError(f"{name}={value!r}: expected milliseconds since the epoch (an integer >= 0)")
    return int(value)


def _int(opts: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    value = _int_optional(opts, name, lo, hi)
    return default if value is None else value


def _int_optional(opts: Mapping[str, str], name: str, lo: int, hi: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    raw = raw.strip()
    if not raw.lstrip("-").isdigit() or not lo <= int(raw) <= hi:
        raise SourceOptionError(f"{name}={raw!r}: expected an integer in [{lo}, {hi}]")
    return int(raw)


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise SourceOptionError(f"{name}={raw!r}: expected true or false")


def parse_security(opts: Mapping[str, str], env: Mapping[str, str]) -> SourceSecurity:
    """Credentials and TLS from the (lower-cased) options, else from ``env`` (the SDK's rules)."""
    return SourceSecurity(_credentials(opts, env), *_tls(opts, env))


def _credentials(opts: Mapping[str, str], env: Mapping[str, str]) -> Credentials | None:
    access, secret, path = opts.get("accesskey"), opts.get("secretkey"), opts.get("credentialsfile")
    if path is not None and (access is not None or secret is not None):
        raise SourceOptionError("give accessKey/secretKey or credentialsFile, not both")
    if path is not None:
        try:
            return load_credentials(path)
        except CredentialsError as exc:
            raise SourceOptionError(f"credentialsFile {exc}") from None
    if access is not None or secret is not None:
        if not access or not secret:
            raise SourceOptionError("accessKey and secretKey go together: both are needed")
        try:
            return Credentials(access, secret)
        except ValueError as exc:
            raise SourceOptionError(f"accessKey/secretKey: {exc}") from None
    try:
        return credentials_from_env(env)
    except CredentialsError as exc:
        raise SourceOptionError(f"no credential option is given and the environment's cannot be used: {exc}") from None


def _tls(opts: Mapping[str, str], env: Mapping[str, str]) -> tuple[bool, str | None, str | None]:
    """(TLS on, CA file, its PEM text)."""
    tls = _bool(opts, "tls", False) if "tls" in opts else None
    ca_file = opts.get("tlscafile")
    if ca_file is not None:
        if tls is False:
            raise SourceOptionError("tlsCaFile is for HTTPS: drop tls=false")
        return True, ca_file, read_ca_file(ca_file, "tlsCaFile")
    if tls is not None:
        return tls, None, None  # explicit: true = the system's CAs, false = plain HTTP
    env_ca = env.get(ENV_TLS_CA_FILE)
    if env_ca:
        return True, env_ca, read_ca_file(env_ca, ENV_TLS_CA_FILE)
    return env.get(ENV_TLS, "").lower() in ("1", "true", "yes"), None, None


def read_ca_file(path: str, name: str) -> str:
    """A CA file's PEM text, checked by building the context a task will build from it."""
    try:
        with open(path, "rb") as f:
            raw = f.read(CA_FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise SourceOptionError(f"{name} {path}: {exc.strerror or exc}") from None
    if len(raw) > CA_FILE_BYTES_MAX:
        raise SourceOptionError(f"{name} {path}: larger than {CA_FILE_BYTES_MAX} bytes")
    try:
        pem = raw.decode("ascii")
        ssl_context_from_pem(pem)
    except (UnicodeDecodeError, ssl.SSLError) as exc:
        raise SourceOptionError(f"{name} {path}: not a PEM CA file ({exc})") from None
    return pem
