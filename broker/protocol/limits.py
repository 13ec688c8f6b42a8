"""The size and count limits of the wire contract, written once: the broker enforces them on what
it receives, the SDK, the tools and the Spark source check them before they send (a clear local
error instead of a round trip), the trace client sizes its messages by them.

A limit here is what the *protocol* allows; a server may be configured tighter (the broker's
``maxMessageSize`` defaults to ``MESSAGE_BYTES_MAX``), and a client may choose a smaller policy of
its own (the SDK's long-poll ``suspend_ms`` stays under its HTTP timeout) — such choices live with
their owner, not here. Units are last in the names (``_BYTES``, ``_CHARS``, ``_MS``)."""

from __future__ import annotations

from typing import Final

# -- one message ----------------------------------------------------------------------------------
MESSAGE_BYTES_MAX: Final = 4 << 20
"""Body bytes of one message, and of the bodies of one batch together (RocketMQ's default
``maxMessageSize``; the broker's default for that setting)."""
TAGS_CHARS_MAX: Final = 255
KEYS_MAX: Final = 32
"""Keys of one message (each indexed for ``/v1/msg/key``)."""
KEY_CHARS_MAX: Final = 255
PROPERTIES_MAX: Final = 64
"""Entries of one message's user properties map."""
PROPERTY_BYTES_MAX: Final = 32 << 10
"""Property names and values of one message together, UTF-8 bytes."""
BORN_HOST_CHARS_MAX: Final = 255

# -- one request ----------------------------------------------------------------------------------
BATCH_MESSAGES_MAX: Final = 1024
"""Messages in one ``/v1/send``."""
PULL_COUNT_MAX: Final = 1024
"""``max_count`` of one ``/v1/pull``."""
PULL_BYTES_MAX: Final = 64 << 20
"""``max_bytes`` of one ``/v1/pull``."""
PULL_SUSPEND_MS_MAX: Final = 3_600_000
"""``suspend_ms`` (long-poll hold) of one ``/v1/pull``."""
QUERY_MESSAGES_MAX: Final = 512
"""``max`` of ``/v1/msg/key`` and ``/v1/msg/unique``."""
QUEUE_NUMS_MAX: Final = 1024
"""Read / write queues of one topic (topic creation, the NameServer's route records)."""
OFFSETS_PER_COMMIT_MAX: Final = 1024
"""Queue offsets in one ``/v1/offsets`` commit."""

# -- one answer (what a client reads) ---------------------------------------------------------------
ANSWER_BYTES_MAX: Final = 256 << 20
"""Body bytes of one HTTP answer the SDK accepts (a pull answer holds at most ``PULL_BYTES_MAX`` of
messages; a larger Content-Length is refused before any byte is read)."""
ANSWER_HEADERS_MAX: Final = 100
"""Header lines of one HTTP answer the SDK accepts."""
