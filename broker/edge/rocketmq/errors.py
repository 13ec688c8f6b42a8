"""The response code a RocketMQ client acts on, for each error the broker service raises.

What the official clients do with a code (4.9.8's ``DefaultMQProducerImpl`` / ``MQClientAPIImpl``,
5.3.1 alike; docs/CLIENT.md has the table): a synchronous send is retried (on another queue, up to
``retryTimesWhenSendFailed`` times) after TOPIC_NOT_EXIST, SERVICE_NOT_AVAILABLE, SYSTEM_ERROR and
NO_PERMISSION; FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE are *results* (a
``SendStatus`` other than SEND_OK, returned to the application, not retried unless
``retryAnotherBrokerWhenNotStoreOK``); every other code (SYSTEM_BUSY, MESSAGE_ILLEGAL, ...) is
thrown to the application at once. So:

    service code                                  answer                   meaning for the client
    NOT_LEADER, NOT_READY, APPEND_FAILED,         SERVICE_NOT_AVAILABLE    not stored: retried at once
      SERVICE_UNAVAILABLE, DISK_FULL
    SEND_TIMEOUT (sends: the outcome is unknown)  FLUSH_SLAVE_TIMEOUT      "maybe": the application decides;
                                                  (send.py, with a header)  a retry with the same message is
                                                                            stored once (de-duplication)
    BUSY, TOO_MANY_CLIENTS                        SYSTEM_BUSY              back-pressure: not retried
    TOPIC_NOT_EXIST                               TOPIC_NOT_EXIST
    NO_PERMISSION, NOT_SUBSCRIBED, CLIENT_ID_TAKEN NO_PERMISSION
      NOT_UPDATABLE (a broker config key that only
      changes with a restart)
    SUBSCRIPTION_PARSE_FAILED                     SUBSCRIPTION_PARSE_FAILED
    a send's bad message (INVALID_*, MESSAGE_TOO_LARGE, RECORD_REFUSED, ...)
                                                  MESSAGE_ILLEGAL          not retried (it would fail again)
    anything else                                 SYSTEM_ERROR

The remark is ``CODE: message`` (the clients show it in their exceptions). The remoting server
answers every coded error in one place with this table (``RemotingServer(response_codes=CODES)``);
a send maps its own (``command_error(send=True)``), for MESSAGE_ILLEGAL and FLUSH_SLAVE_TIMEOUT.
"""

from __future__ import annotations

from typing import Final

from broker.protocol.auth import AuthError
from broker.protocol.errors import ProtocolError
from broker.protocol.rocketmq.codes import ResponseCode
from broker.serving.remoting_server import CommandError

NOT_STORED: Final = frozenset({"NOT_LEADER", "NOT_READY", "APPEND_FAILED", "SERVICE_UNAVAILABLE", "DISK_FULL"})
CODES: Final[dict[str, int]] = {
    **dict.fromkeys(NOT_STORED, ResponseCode.SERVICE_NOT_AVAILABLE),
    "BUSY": ResponseCode.SYSTEM_BUSY,
    "TOO_MANY_CLIENTS": ResponseCode.SYSTEM_BUSY,
    "TOPIC_NOT_EXIST": ResponseCode.TOPIC_NOT_EXIST,
    "NO_PERMISSION": ResponseCode.NO_PERMISSION,
    "NOT_SUBSCRIBED": ResponseCode.NO_PERMISSION,
    "CLIENT_ID_TAKEN": ResponseCode.NO_PERMISSION,
    "NOT_UPDATABLE": ResponseCode.NO_PERMISSION,
    "SUBSCRIPTION_PARSE_FAILED": ResponseCode.SUBSCRIPTION_PARSE_FAILED,
}
SEND_TIMEOUT: Final = "SEND_TIMEOUT"


def code_of(service_code: str, *, send: bool = False) -> int:
    """The response code for a service error ``service_code``; ``send``: the request stores a
    message (its validation errors are MESSAGE_ILLEGAL, never retried)."""
    code = CODES.get(service_code)
    if code is not None:
        return code
    if send and service_code != SEND_TIMEOUT:
        return ResponseCode.MESSAGE_ILLEGAL
    return ResponseCode.SYSTEM_ERROR


def command_error(exc: ProtocolError, *, send: bool = False) -> CommandError:
    """The answer to a coded error a send raised (``send``: its validation errors are
    MESSAGE_ILLEGAL); every other handler's coded errors are answered by the remoting server with
    ``CODES`` (``RocketMQEdge`` gives it the table: ``RemotingServer(response_codes=...)``). A refused
    signature or permission is NO_PERMISSION either way."""
    code = ResponseCode.NO_PERMISSION if isinstance(exc, AuthError) else code_of(exc.code, send=send)
    return CommandError(code, f"{exc.code}: {exc.message}")
