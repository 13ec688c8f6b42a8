"""The one error type of the wire contract: a RocketMQ-style ``code`` users can read and a message.

Servers map subclasses to HTTP statuses (``{code, message}`` bodies); the SDK turns a broker's or
NameServer's answer into a ``ClientError`` carrying the same code.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """An expected failure with a code users can read. Subclasses say which HTTP status fits."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
