"""``Admin``: the operator's client — clusters, topics, groups, offsets, message queries, leadership.

Where each call goes:

- routes, clusters and topic lists: any NameServer (``NamesrvClient``: tried in random order);
- reads of a broker group: its leader (``broker_addrs[0]``) first, then the other replicas, moving
  on only when a replica cannot be reached (an answer, even an error, is final);
- writes: the group's leader (any replica when the NameServer knows none; the next replica when
  one refuses the connection); a ``NOT_LEADER`` answer that names ``leader_addr`` is followed
  once, never more, so stale routes cost one extra hop and a leader-less group fails fast.

Operations that write to several targets (every group of a cluster, every NameServer) try all of
them and raise ``FanOutError`` — carrying every target's ``Outcome`` — when any failed, so one dead
group never hides what happened on the others. Arguments are checked before any request: a bad one
raises ``InvalidArgument``, a ``ClientError`` with ``status`` 0 that never reached the cluster.

The calls live by area, one class per module, each over the one before: ``admin_base.py``
(``AdminBase``: connection and building blocks), ``admin_cluster.py`` (NameServer, topics, groups,
offsets, brokers), ``admin_messages.py`` (message queries, pulls, dead-letter queues); the records
they answer and the errors are in ``admin_records.py``, the argument checks in ``admin_checks.py``.
"""

from __future__ import annotations

from broker.client.admin_messages import AdminMessageOps


class Admin(AdminMessageOps):
    """Admin calls on a cluster; ``async with Admin("a:9876;b:9877") as admin: ...``."""

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
