"""``dledger-dashboard --namesrv 127.0.0.1:9876 [--listen 127.0.0.1:8080]``: a web dashboard over one
cluster (what rocketmq-dashboard shows), served by aiohttp as server-rendered HTML plus one small
vanilla script (``static/dashboard.js``: live values and SVG charts; no Node build, no CDN).

Pages: ``/`` clusters and broker groups (role, term, commit/applied index, follower lag per replica,
live charts of TPS, lag and elections); ``/topics`` and ``/topic?t=`` (queues, offsets, TPS);
``/groups`` and ``/group?g=`` (lag per queue, members); ``/message`` (query by msgId, key or unique
key); ``POST /transfer`` (leadership transfer). ``/api/live`` is the JSON the script polls.

Reads use the dashboard's own account (``--credentials`` / the environment, as mqadmin). Acting
(leadership transfer) needs the operator's account typed into the form: the request to the broker is
signed with it, so the broker's ACL decides (an admin account is needed), never the dashboard's.
Every page is bounded: at most ``ROWS_MAX`` rows per table, requests time out after ``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import logging
import signal
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from broker.client.admin import Admin
from broker.client.admin_records import BrokerMember, InvalidArgument, MessageView
from broker.client.transport import ClientError, add_security_arguments, security_kwargs
from broker.protocol.auth import Credentials, CredentialsError
from broker.tools.mqadmin_cluster import group_members
from broker.tools.mqadmin_format import body_text, format_ts, perm_text
from broker.tools.mqadmin_stats import scrape_metrics

log = logging.getLogger("broker.tools.dashboard")

STATIC = Path(__file__).parent / "static"
ROWS_MAX = 2000
FORM_BYTES_MAX = 16 << 10
ADMIN_KEY: web.AppKey[Admin] = web.AppKey("admin", Admin)


# -- rendering ------------------------------------------------------------------------------------
def esc(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return html.escape(str(value))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, ident: str = "", raw: int = -1) -> str:
    """An HTML table; column ``raw`` holds HTML already (a link), every other cell is escaped."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        if i >= ROWS_MAX:
            body.append(f'<tr><td colspan="{len(headers)}">… more rows not shown</td></tr>')
            break
        cells = "".join(
            f"<td>{c if j == raw else esc(c)}</td>" for j, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    id_attr = f' id="{esc(ident)}"' if ident else ""
    return f"<table{id_attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def page(title: str, body: str, *, live: bool = False) -> web.Response:
    nav = " ".join(
        f'<a href="{href}">{name}</a>'
        for href, name in (("/", "Cluster"), ("/topics", "Topics"), ("/groups", "Consumer groups"),
                           ("/message", "Messages"))
    )
    script = '<script src="/static/dashboard.js"></script>' if live else ""
    text = (
        "<!doctype html><html><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)} · dledger-dashboard</title>"
        '<link rel="stylesheet" href="/static/dashboard.css"></head>'
        f"<body><nav>{nav}</nav><main><h1>{esc(title)}</h1>{body}</main>{script}</body></html>"
    )
    return web.Response(text=text, content_type="text/html")


def error_box(exc: Exception) -> str:
    code = getattr(exc, "code", type(exc).__name__)
    message = getattr(exc, "message", str(exc))
    return f'<p class="error" id="error">{esc(code)}: {esc(message)}</p>'


def chart(name: str, caption: str) -> str:
    svg = f'<svg id="chart-{name}" viewBox="0 0 300 100"></svg>'
    return f"<figure><figcaption>{esc(caption)}</figcaption>{svg}</figure>"


def link(path: str, param: str, value: str) -> str:
    from urllib.parse import quote

    return f'<a href="{path}?{param}={quote(value, safe="")}">{esc(value)}</a>'


# -- data -----------------------------------------------------------------------------------------
async def members_with_lag(admin: Admin) -> list[dict[str, Any]]:
    """Every registered replica with its status, and on leaders each follower's lag."""
    rows: list[BrokerMember] = await admin.cluster_list()
    lags: dict[tuple[str, str], Any] = {}
    elections: dict[str, int] = {}
    for m in rows:
        if m.role != "LEADER":
            continue
        try:
            st = await admin.transport.call(m.addr, "GET", "/v1/status", timeout_s=2.0)
        except ClientError:
            continue
        for pid, p in dict(st.get("peers") or {}).items():
            lags[(m.broker_name, str(pid))] = p.get("lag")
        elections[m.broker_name] = int(dict(st.get("raft") or {}).get("elections") or 0)
    out = []
    for m in rows:
        out.append(
            {
                "cluster": m.cluster,
                "broker_name": m.broker_name,
                "broker_id": m.broker_id,
                "addr": m.addr,
                "self_id": m.self_id,
                "role": m.role or m.error,
                "term": m.term,
                "leader_id": m.leader_id,
                "writable": m.writable,
                "commit_index": m.commit_index,
                "applied_index": m.applied_index,
                "lag": lags.get((m.broker_name, m.self_id or "")),
            }
        )
    return out


async def leader_metrics(admin: Admin) -> list[dict[str, list[tuple[dict[str, str], float]]]]:
    groups = await admin.all_groups()
    addrs = [bd.leader_addr for bd in groups if bd.leader_addr]
    timeout_s = admin.transport.timeout_s
    got = await asyncio.gather(*(scrape_metrics(admin, a, timeout_s) for a in addrs), return_exceptions=True)
    return [g for g in got if not isinstance(g, BaseException)]


def sum_by(scrapes: Sequence[dict[str, Any]], name: str, *labels: str) -> dict[Any, float]:
    out: dict[Any, float] = {}
    for s in scrapes:
        for lab, v in s.get(name, []):
            key = tuple(lab.get(k, "") for k in labels)
            key = key[0] if len(key) == 1 else key
            out[key] = out.get(key, 0.0) + v
    return out


async def live(admin: Admin) -> dict[str, Any]:
    members = await members_with_lag(admin)
    scrapes = await leader_metrics(admin)
    terms = {m["broker_name"]: m["term"] for m in members if m["role"] == "LEADER"}
    return {
        "members": members,
        "tps": sum_by(scrapes, "rocketmq_producer_tps", "topic"),
        "lag": sum_by(scrapes, "rocketmq_group_diff", "group"),
        "terms": terms,
    }


# -- handlers -------------------------------------------------------------------------------------
def _member_rows(members: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (m["cluster"], m["broker_name"], m["self_id"], m["broker_id"], m["addr"], m["role"], m["term"],
         m["leader_id"], m["writable"], m["commit_index"], m["applied_index"], m["lag"])
        for m in members
    ]


MEMBER_HEADERS = ["Cluster", "Broker Name", "Self Id", "BID", "Addr", "Role", "Term", "Leader", "Writable",
                  "Commit Index", "Applied Index", "Follower Lag"]


async def overview(request: web.Request) -> web.Response:
    admin = request.app[ADMIN_KEY]
    try:
        members = await members_with_lag(admin)
    except (ClientError, InvalidArgument) as exc:
        return page("Cluster", error_box(exc))
    body = [table(MEMBER_HEADERS, _member_rows(members), ident="members")]
    names = sorted({m["broker_name"] for m in members})
    options = "".join(f"<option>{esc(n)}</option>" for n in names)
    body.append(
        '<h2>Live</h2><div class="charts">'
        + chart("tps", "Producer TPS (all topics)")
        + chart("lag", "Consumer lag (all groups)")
        + chart("terms", "Leader changes (sum of terms)")
        + '</div><ul id="events"></ul>'
        '<h2>Leadership transfer</h2>'
        '<form method="post" action="/transfer" id="transfer">'
        f'<label>Broker group <select name="broker">{options}</select></label> '
        '<label>Target id <input name="target" placeholder="any"></label> '
        '<label>Access key <input name="access_key" autocomplete="username"></label> '
        '<label>Secret key <input name="secret_key" type="password" autocomplete="current-password"></label> '
        '<button type="submit">Transfer</button></form>'
    )
    return page("Cluster", "".join(body), live=True)


async def topics(request: web.Request) -> web.Response:
    admin = request.app[ADMIN_KEY]
    try:
        names = await admin.topic_list()
        scrapes = await leader_metrics(admin)
    except (ClientError, InvalidArgument) as exc:
        return page("Topics", error_box(exc))
    tps = sum_by(scrapes, "rocketmq_producer_tps", "topic")
    offsets = sum_by(scrapes, "rocketmq_producer_offset", "topic")
    rows = [(link("/topic", "t", n), int(offsets[n]) if n in offsets else None, f"{tps.get(n, 0.0):.2f}")
            for n in names]
    return page("Topics", table(["Topic", "Messages (sum of max offsets)", "TPS (10 s)"], rows, ident="topics", raw=0))


async def topic(request: web.Request) -> web.Response:
    admin = request.app[ADMIN_KEY]
    name = request.query.get("t", "")
    try:
        route = await admin.topic_route(name)
        status = await admin.topic_status(name)
    except (ClientError, InvalidArgument) as exc:
        return page(f"Topic {name}", error_box(exc))
    qd = table(["Broker Name", "Read Queues", "Write Queues", "Perm"],
               [(q.broker_name, q.read_queue_nums, q.write_queue_nums, perm_text(q.perm)) for q in route.queue_datas])
    qs = table(["Broker Name", "QID", "Min Offset", "Max Offset", "Last Updated"],
               [(r.broker_name, r.queue_id, r.min_offset, r.max_offset, format_ts(r.last_store_ts)) for r in status],
               ident="queues")
    return page(f"Topic {name}", f"{qd}<h2>Queues</h2>{qs}")


async def groups(request: web.Request) -> web.Response:
    admin = request.app[ADMIN_KEY]
    try:
        found: dict[str, dict[str, Any]] = {}
        for bd in await admin.all_groups():
            try:
                listed = await admin.read(bd, "/v1/groups")
            except ClientError:
                continue
            for g in listed.get("groups") or []:
                found.setdefault(str(g.get("group")), dict(g))
        scrapes = await leader_metrics(admin)
    except (ClientError, InvalidArgument) as exc:
        return page("Consumer groups", error_box(exc))
    lag = sum_by(scrapes, "rocketmq_group_diff", "group")
    for g in lag:
        found.setdefault(str(g), {})
    rows = [
        (link("/group", "g", g), int(lag[g]) if g in lag else None, found[g].get("consume_enable"),
         found[g].get("consume_broadcast_enable"))
        for g in sorted(found)
    ]
    return page("Consumer groups", table(["Group", "Lag", "Consume Enable", "Broadcast Enable"], rows,
                                         ident="groups", raw=0))


async def group(request: web.Request) -> web.Response:
    admin = request.app[ADMIN_KEY]
    name = request.query.get("g", "")
    try:
        progress = await admin.consumer_progress(name)
        members = await group_members(admin, name)
    except (ClientError, InvalidArgument) as exc:
        return page(f"Consumer group {name}", error_box(exc))
    rows = [(q.topic, q.broker_name, q.queue_id, q.broker_offset, q.consumer_offset, q.lag, format_ts(q.last_ts))
            for q in progress.queues]
    body = table(["Topic", "Broker Name", "QID", "Broker Offset", "Consumer Offset", "Diff", "LastTime"], rows,
                 ident="progress")
    body += f'<p>Diff Total: <span id="total-lag">{progress.total_lag}</span></p><h2>Members</h2>'
    body += table(["Client Id", "Model", "Topics", "Broker"],
                  [(m.get("client_id"), m.get("model"), ",".join(m.get("topics") or ()), b) for b, m in members],
                  ident="members")
    return page(f"Consumer group {name}", body)


def _message_rows(msgs: Sequence[MessageView]) -> list[tuple[Any, ...]]:
    return [(m.broker_name, m.queue_id, m.queue_offset, m.msg_id, m.unique_id, m.tags or None,
             " ".join(m.keys) or None, format_ts(m.store_ts), body_text(m.body)) for m in msgs]


async def message(request: web.Request) -> web.Response:
    admin = request.app[ADMIN_KEY]
    q = request.query
    form = (
        '<form method="get" action="/message" id="query">'
        f'<label>Topic <input name="topic" value="{esc(q.get("topic", ""))}"></label> '
        f'<label>Message id <input name="id" value="{esc(q.get("id", ""))}"></label> '
        f'<label>Key <input name="key" value="{esc(q.get("key", ""))}"></label> '
        f'<label>Unique key <input name="unique" value="{esc(q.get("unique", ""))}"></label> '
        '<button type="submit">Query</button></form>'
    )
    result = ""
    try:
        msgs: list[MessageView] = []
        if q.get("id"):
            msgs = [await admin.query_msg_by_id(q["id"])]
        elif q.get("key"):
            msgs = await admin.query_msg_by_key(q.get("topic", ""), q["key"], 64)
        elif q.get("unique"):
            msgs = await admin.query_msg_by_unique_key(q.get("topic", ""), q["unique"])
        if q.get("id") or q.get("key") or q.get("unique"):
            result = table(["Broker Name", "QID", "Offset", "Message ID", "Unique Key", "Tags", "Keys",
                            "Store Time", "Body"], _message_rows(msgs), ident="messages")
            result += f"<p>Found: {len(msgs)}</p>"
    except (ClientError, InvalidArgument) as exc:
        result = error_box(exc)
    return page("Messages", form + result)


async def transfer(request: web.Request) -> web.Response:
    admin = request.app[ADMIN_KEY]
    if request.content_length is not None and request.content_length > FORM_BYTES_MAX:
        raise web.HTTPRequestEntityTooLarge(max_size=FORM_BYTES_MAX, actual_size=request.content_length)
    form = await request.post()
    broker = str(form.get("broker", ""))
    target = str(form.get("target", "")).strip() or None
    try:
        creds = Credentials(str(form.get("access_key", "")), str(form.get("secret_key", "")))
    except ValueError as exc:
        return page("Leadership transfer", f'<p class="error" id="error">CREDENTIALS_REQUIRED: {esc(exc)}</p>')
    acting = Admin(admin.namesrv.addrs, timeout_s=admin.transport.timeout_s, credentials=creds,
                   tls=admin.transport.ssl_context or False)
    try:
        result = await acting.transfer_leader(broker, target)
    except (ClientError, InvalidArgument) as exc:
        return page("Leadership transfer", error_box(exc))
    finally:
        await acting.close()
    body = f'<p id="result">{esc(result.broker_name)}: the new leader is {esc(result.leader_id)}</p>'
    return page("Leadership transfer", body + '<p><a href="/">Back</a></p>')


async def api_live(request: web.Request) -> web.Response:
    try:
        data = await live(request.app[ADMIN_KEY])
    except (ClientError, InvalidArgument) as exc:
        return web.json_response({"code": exc.code, "message": exc.message}, status=502)
    return web.json_response(data)


def make_app(admin: Admin) -> web.Application:
    app = web.Application(client_max_size=FORM_BYTES_MAX)
    app[ADMIN_KEY] = admin
    app.router.add_get("/", overview)
    app.router.add_get("/topics", topics)
    app.router.add_get("/topic", topic)
    app.router.add_get("/groups", groups)
    app.router.add_get("/group", group)
    app.router.add_get("/message", message)
    app.router.add_post("/transfer", transfer)
    app.router.add_get("/api/live", api_live)
    app.router.add_static("/static", STATIC)

    async def close(_app: web.Application) -> None:
        await admin.close()

    app.on_cleanup.append(close)
    return app


async def start(admin: Admin, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve on host:port (0: any free port); returns the runner and the bound port."""
    runner = web.AppRunner(make_app(admin), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    addresses = runner.addresses  # the bound (host, port, ...) of each listening socket
    bound = addresses[0][1] if addresses else port
    return runner, int(bound)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dledger-dashboard", description="Web dashboard of a dledger-mq cluster.")
    p.add_argument("-n", "--namesrv", default=None, help="NameServer list 'a:9876;b:9877' (default: $NAMESRV_ADDR)")
    p.add_argument("--listen", default="127.0.0.1:8080", help="host:port to serve on (default 127.0.0.1:8080)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds per request to the cluster")
    add_security_arguments(p)
    args = p.parse_args(argv)
    host, _, port_text = args.listen.rpartition(":")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        print(f"dledger-dashboard: --listen {args.listen!r} must be host:port", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        admin = Admin(args.namesrv, timeout_s=args.timeout, **security_kwargs(args))
    except (InvalidArgument, CredentialsError) as exc:
        print(f"dledger-dashboard: {exc}", file=sys.stderr)
        return 2

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        runner, bound = await start(admin, host, int(port_text))
        log.info("dashboard on http://%s:%d (NameServers %s)", host, bound, ";".join(admin.namesrv.addrs))
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
        log.info("dashboard stopped")

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"dledger-dashboard: cannot serve on {args.listen}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

