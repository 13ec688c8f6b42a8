"""The coded error of the remoting codecs: every decoder turns bad bytes into ``RemotingError``.

Codes (``code``): ``BAD_FRAME`` (lengths that do not add up, a header type we do not know),
``FRAME_TOO_LARGE``, ``HEADER_TOO_LARGE``, ``BAD_HEADER`` (the JSON or binary header cannot be
read), ``MISSING_FIELD`` / ``BAD_FIELD`` (a header field absent or out of range; the message names
it), ``BAD_JSON`` / ``BAD_BODY`` (a body), ``BAD_MESSAGE`` (a stored or batched message),
``BAD_PROPERTIES``, ``BAD_MESSAGE_ID``, ``UNSUPPORTED_COMPRESSION``, ``BODY_TOO_LARGE``.
A server answers such a request with ``ResponseCode.SYSTEM_ERROR`` (or closes the connection for
frame-level codes: after a bad frame the stream cannot be trusted to be aligned).
"""

from __future__ import annotations

from broker.protocol.errors import ProtocolError


class RemotingError(ProtocolError):
    """Bad remoting input: ``code`` (one of the module's codes) and a message naming the part."""
