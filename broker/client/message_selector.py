"""RocketMQ's ``MessageSelector``: what a subscription or a pull filters by — tags or SQL92.

    consumer.subscribe("T", MessageSelector.by_sql("a > 5 AND region IN ('eu','us')"))
    consumer.subscribe("T", MessageSelector.by_tag("TagA || TagB"))
    consumer.subscribe("T", "TagA || TagB")   # a plain string keeps meaning tags

An SQL expression is compiled here, at subscribe time, by the broker's own compiler
(``broker.protocol.sql_filter``): an invalid one is refused at once with the position of the error
(``ClientError`` ``SUBSCRIPTION_PARSE_FAILED``), before anything is sent. The broker compiles it
again (it trusts no client) and answers HTTP 400 with the same code for an expression it refuses.
"""

from __future__ import annotations

import dataclasses

from broker.client.message import parse_tags_expression, tags_expression
from broker.client.transport import ClientError

TAG = "TAG"
SQL92 = "SQL92"


@dataclasses.dataclass(frozen=True)
class MessageSelector:
    expression_type: str  # TAG | SQL92
    expression: str

    @classmethod
    def by_tag(cls, expression: str = "*") -> MessageSelector:
        """``"*"`` (every message) or ``"TagA || TagB"``."""
        return cls(TAG, tags_expression(parse_tags_expression(expression)))

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        """An SQL92 condition over the message's properties (docs/CLIENT.md, "Filters")."""
        # The compiler (lark) is loaded by the first SQL selector, not by every import of the SDK.
        from broker.protocol.sql_filter import SqlFilterError, compile_filter

        try:
            compile_filter(expression)
        except SqlFilterError as exc:
            raise ClientError("SUBSCRIPTION_PARSE_FAILED", f"SQL92 expression {expression[:200]!r}: {exc}") from None
        return cls(SQL92, expression)

    @property
    def is_sql(self) -> bool:
        return self.expression_type == SQL92


Selector = str | MessageSelector


def as_selector(value: Selector) -> MessageSelector:
    """A plain string means tags (RocketMQ's ``subscribe(topic, subExpression)``)."""
    if isinstance(value, MessageSelector):
        return value
    if not isinstance(value, str):
        raise ClientError("INVALID_TAGS", "a subscription is a tag expression or a MessageSelector")
    return MessageSelector.by_tag(value)


def pull_filter(value: Selector) -> tuple[str, str | None]:
    """(the pull's ``tags``, its ``sql``) for a selector."""
    sel = as_selector(value)
    return ("*", sel.expression) if sel.is_sql else (sel.expression, None)
