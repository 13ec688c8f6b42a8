"""``dledger-dashboard --namesrv 127.0.0.1:9876 [--listen 127.0.0.1:8080]``: a web dashboard over one
cluster (what rocketmq-dashboard shows), served by aiohttp as server-rendered HTML plus one small
vanilla script (``static/dashboard.js``: live values and SVG charts; no Node build, no CDN).

Pages: ``/`` clusters and broker groups (role, term, commit/applied index, follower lag per replica,
live charts of TPS, lag and elections); ``/topics`` and ``/topic?t=`` (queues, offsets, TPS);
``/groups`` and ``/group?g=`` (lag per queue, members); ``/message`` (query by msgId, key or unique
key); ``POST /transfer`` (leadership transfer). ``/api/live`` is the JSON the script polls.

**Login** (issue 23, finding 6). Every page but ``/login`` and ``/static`` needs a session: the
operator signs in with an ACL account (access key and secret key, as mqadmin's credentials file
holds them), which the dashboard checks with one signed request to a broker, then keeps in memory
for that session only (a random cookie, HttpOnly, SameSite=Strict; at most ``SESSIONS_MAX``
sessions, ended after ``SESSION_IDLE_S`` idle or ``SESSION_LIFE_S`` in all). Every request the
pages make to the cluster is signed with the session's account, so the brokers' ACL decides what
it sees: a message body only for an account with SUB on its topic (403 otherwise), a leadership
transfer only for an admin account. The dashboard holds no account of its own. Forms that act carry
the session's CSRF token. A GET without a session is redirected to ``/login`` (303); ``/api/live``
answers 401.

Errors are pages with the status they mean: 400 for a bad argument, the broker's own 4xx (403
``NO_PERMISSION``, 404 ``MESSAGE_NOT_FOUND``, ...), 502 when the cluster did not answer, 404 for an
unknown page (papercut 8 of issue 28: they all answered 200).
Every page is bounded: at most ``ROWS_MAX`` rows per table, requests time out after ``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import hmac
import html
import logging
import secrets
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from aiohttp import web

from broker.client.admin import Admin
from broker.client.admin_records import BrokerMember, InvalidArgument, MessageView
from broker.client.transport import FROM_ENV, ClientError, client_ssl_context
from broker.protocol.auth import Credentials, CredentialsError
from broker.protocol.errors import ProtocolError
from broker.tools.mqadmin_cluster import group_members
from broker.tools.mqadmin_format import body_text, format_ts, perm_text
from broker.tools.mqadmin_stats import scrape_metrics
from dledger.clock import SYSTEM, Clock

log = logging.getLogger("broker.tools.dashboard")

STATIC = Path(__file__).parent / "static"
ROWS_MAX = 2000
FORM_BYTES_MAX = 16 << 10
SESSION_COOKIE: Final = "dledger_session"
SESSIONS_MAX: Final = 256
SESSION_IDLE_S: Final = 1800.0
SESSION_LIFE_S: Final = 12 * 3600.0
LOGINS_IN_FLIGHT: Final = 4  # account checks running at once (each is a request to a broker)
PUBLIC_PATHS: Final = ("/login", "/static/")


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


def page(
    title: str, body: str, *, live: bool = False, status: int = 200, session: Session | None = None
) -> web.Response:
    links = (("/", "Cluster"), ("/topics", "Topics"), ("/groups", "Consumer groups"), ("/message", "Messages"))
    nav = " ".join(f'<a href="{href}">{name}</a>' for href, name in links) if session is not None else ""
    if session is not None:
        nav += (f' <span id="account">{esc(session.access_key)}</span>'
                '<form method="post" action="/logout" class="inline">'
                f'<input type="hidden" name="csrf" value="{esc(session.csrf)}"><button type="submit">Log out</button>'
                "</form>")
    script = '<script src="/static/dashboard.js"></script>' if live else ""
    text = (
        "<!doctype html><html><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)} · dledger-dashboard</title>"
        '<link rel="stylesheet" href="/static/dashboard.css"></head>'
        f"<body><nav>{nav}</nav><main><h1>{esc(title)}</h1>{body}</main>{script}</body></html>"
    )
    return web.Response(text=text, content_type="text/html", status=status,
                        headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY"})


def error_box(exc: Exception) -> str:
    code = getattr(exc, "code", type(exc).__name__)
    message = getattr(exc, "message", str(exc))
    return f'<p class="error" id="error">{esc(code)}: {esc(message)}</p>'


def error_status(exc: Exception) -> int:
    """The status an error page answers with: 400 for a bad argument, a broker's own 4xx, else 502
    (the cluster did not answer, or failed: the dashboard is its gateway)."""
    if isinstance(exc, InvalidArgument):
        return 400
    status = getattr(exc, "status", 0)
    return status if isinstance(status, int) and 400 <= status < 500 else 502


def failed(request: web.Request, title: str, exc: Exception) -> web.Response:
    return page(title, error_box(exc), status=error_status(exc), session=request.get(SESSION_KEY))


def chart(name: str, caption: str) -> str:
    svg = f'<svg id="chart-{name}" viewBox="0 0 300 100"></svg>'
    return f"<figure><figcaption>{esc(caption)}</figcaption>{svg}</figure>"


def link(path: str, param: str, value: str) -> str:
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


# -- sessions ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class ClusterAccess:
    """How to reach the cluster (from the command line): NameServers, timeout, TLS. No account."""

    namesrv_addrs: tuple[str, ...]
    timeout_s: float
    tls: ssl.SSLContext | None

    def admin(self, creds: Credentials) -> Admin:
        return Admin(list(self.namesrv_addrs), timeout_s=self.timeout_s, credentials=creds, tls=self.tls or False)


@dataclasses.dataclass(slots=True)
class Session:
    access_key: str
    admin: Admin  # signs with the session's account
    csrf: str
    created_s: float
    used_s: float


class Sessions:
    """The signed-in operators, by cookie token (one owner: the event loop). Bounded in number and
    time; an evicted or expired session's connections are closed."""

    def __init__(self, clock: Clock = SYSTEM, *, sessions_max: int = SESSIONS_MAX, idle_s: float = SESSION_IDLE_S,
                 life_s: float = SESSION_LIFE_S):
        self._clock = clock
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()
        self.sessions_max, self.idle_s, self.life_s = sessions_max, idle_s, life_s
        self.logins = asyncio.Semaphore(LOGINS_IN_FLIGHT)

    def __len__(self) -> int:
        return len(self._sessions)

    async def get(self, token: str | None) -> Session | None:
        if not token:
            return None
        s = self._sessions.get(token)
        if s is None:
            return None
        now = self._clock.monotonic()
        if now - s.used_s > self.idle_s or now - s.created_s > self.life_s:
            await self.drop(token)
            return None
        s.used_s = now
        self._sessions.move_to_end(token)
        return s

    async def add(self, access_key: str, admin: Admin) -> tuple[str, Session]:
        while len(self._sessions) >= self.sessions_max:
            await self.drop(next(iter(self._sessions)))  # the least recently used
        token = secrets.token_urlsafe(32)
        now = self._clock.monotonic()
        s = self._sessions[token] = Session(access_key, admin, secrets.token_urlsafe(24), now, now)
        return token, s

    async def drop(self, token: str) -> None:
        s = self._sessions.pop(token, None)
        if s is not None:
            await s.admin.close()

    async def close(self) -> None:
        for token in list(self._sessions):
            await self.drop(token)


ACCESS_KEY: web.AppKey[ClusterAccess] = web.AppKey("access", ClusterAccess)
SESSIONS_KEY: web.AppKey[Sessions] = web.AppKey("sessions", Sessions)
SESSION_KEY: Final = web.RequestKey("session", Session)


def session_of(request: web.Request) -> Session:
    return request[SESSION_KEY]


def admin_of(request: web.Request) -> Admin:
    return request[SESSION_KEY].admin


class LoginRefused(ProtocolError):
    """A sign-in refused: shown on the login page with its code and answered with its status."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(code, message, status)


def safe_next(value: str) -> str:
    """A local path to go back to after the login (never another site: no scheme, no '//')."""
    if not value.startswith("/") or value.startswith("//") or "\\" in value or len(value) > 2000:
        return "/"
    return value


@web.middleware
async def login_required(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
    if request.path == "/login" or request.path.startswith("/static/"):
        return await handler(request)
    session = await request.app[SESSIONS_KEY].get(request.cookies.get(SESSION_COOKIE))
    if session is None:
        if request.path.startswith("/api/"):
            return web.json_response({"code": "LOGIN_REQUIRED", "message": "sign in at /login"}, status=401)
        if request.method == "GET":
            raise web.HTTPSeeOther("/login?next=" + quote(request.path_qs, safe=""))
        return page("Sign in required", '<p class="error" id="error">LOGIN_REQUIRED: sign in first '
                    '(<a href="/login">sign in</a>)</p>', status=401)
    if request.method == "POST":
        form = await request.post()
        if not hmac.compare_digest(str(form.get("csrf", "")), session.csrf):
            return page("Refused", '<p class="error" id="error">BAD_CSRF: this form did not come from this '
                        "dashboard's page: reload it</p>", status=403, session=session)
    request[SESSION_KEY] = session
    return await handler(request)


@web.middleware
async def error_pages(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
    """aiohttp's own errors (unknown page, form too large, bad method) as pages with their status."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = exc.reason.upper().replace(" ", "_")
        return page(exc.reason, f'<p class="error" id="error">{esc(code)}: {esc(exc.text or exc.reason)}</p>',
                    status=exc.status, session=request.get(SESSION_KEY))


def login_form(next_path: str, error: str = "") -> str:
    return (
        error
        + '<form method="post" action="/login" id="login">'
        f'<input type="hidden" name="next" value="{esc(next_path)}">'
        '<label>Access key <input name="access_key" autocomplete="username"></label> '
        '<label>Secret key <input name="secret_key" type="password" autocomplete="current-password"></label> '
        '<button type="submit">Sign in</button></form>'
        "<p>An account of the cluster's ACL (as in mqadmin's credentials file). What the pages show is what "
        "the brokers let this account read.</p>"
    )


async def login_page(request: web.Request) -> web.Response:
    return page("Sign in", login_form(safe_next(request.query.get("next", "/"))))


async def check_account(access: ClusterAccess, creds: Credentials) -> Admin:
    """An ``Admin`` signing as ``creds``, once a broker accepted one request signed with them."""
    admin = access.admin(creds)
    try:
        groups = await admin.all_groups()
        if not groups:
            raise LoginRefused(503, "NO_BROKER", "no broker group is registered to check the account with")
        await admin.read(groups[0], "/v1/topics")  # any account may; a stranger or a wrong secret may not
    except ClientError as exc:
        await admin.close()
        if exc.status == 401:
            raise LoginRefused(401, "LOGIN_FAILED", "unknown access key or wrong secret key") from None
        raise
    except BaseException:
        await admin.close()
        raise
    return admin


async def login(request: web.Request) -> web.Response:
    form = await request.post()
    next_path = safe_next(str(form.get("next", "/")))
    sessions = request.app[SESSIONS_KEY]
    try:
        creds = Credentials(str(form.get("access_key", "")), str(form.get("secret_key", "")))
    except ValueError as exc:
        refused = f'<p class="error" id="error">CREDENTIALS_REQUIRED: {esc(exc)}</p>'
        return page("Sign in", login_form(next_path, refused), status=400)
    if sessions.logins.locked():
        return page("Sign in", login_form(next_path, '<p class="error" id="error">BUSY: too many sign-ins at once; '
                                          "retry</p>"), status=429)
    async with sessions.logins:
        try:
            admin = await check_account(request.app[ACCESS_KEY], creds)
        except LoginRefused as exc:
            return page("Sign in", login_form(next_path, error_box(exc)), status=exc.status)
        except (ClientError, InvalidArgument) as exc:
            return page("Sign in", login_form(next_path, error_box(exc)), status=error_status(exc))
    token, _s = await sessions.add(creds.access_key, admin)
    resp = web.Response(status=303, headers={"Location": next_path, "Cache-Control": "no-store"})
    resp.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="Strict", path="/")
    return resp


async def logout(request: web.Request) -> web.Response:
    await request.app[SESSIONS_KEY].drop(request.cookies.get(SESSION_COOKIE, ""))
    resp = web.Response(status=303, headers={"Location": "/login"})
    resp.del_cookie(SESSION_COOKIE, path="/")
    return resp


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
    admin = admin_of(request)
    try:
        members = await members_with_lag(admin)
    except (ClientError, InvalidArgument) as exc:
        return failed(request, "Cluster", exc)
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
        f'<input type="hidden" name="csrf" value="{esc(session_of(request).csrf)}">'
        '<button type="submit">Transfer</button> (signed with your account: the broker needs an admin one)</form>'
    )
    return page("Cluster", "".join(body), live=True, session=session_of(request))


async def topics(request: web.Request) -> web.Response:
    admin = admin_of(request)
    try:
        names = await admin.topic_list()
        scrapes = await leader_metrics(admin)
    except (ClientError, InvalidArgument) as exc:
        return failed(request, "Topics", exc)
    tps = sum_by(scrapes, "rocketmq_producer_tps", "topic")
    offsets = sum_by(scrapes, "rocketmq_producer_offset", "topic")
    rows = [(link("/topic", "t", n), int(offsets[n]) if n in offsets else None, f"{tps.get(n, 0.0):.2f}")
            for n in names]
    return page("Topics", table(["Topic", "Messages (sum of max offsets)", "TPS (10 s)"], rows, ident="topics", raw=0),
                session=session_of(request))


async def topic(request: web.Request) -> web.Response:
    admin = admin_of(request)
    name = request.query.get("t", "")
    try:
        route = await admin.topic_route(name)
        status = await admin.topic_status(name)
    except (ClientError, InvalidArgument) as exc:
        return failed(request, f"Topic {name}", exc)
    qd = table(["Broker Name", "Read Queues", "Write Queues", "Perm"],
               [(q.broker_name, q.read_queue_nums, q.write_queue_nums, perm_text(q.perm)) for q in route.queue_datas])
    qs = table(["Broker Name", "QID", "Min Offset", "Max Offset", "Last Updated"],
               [(r.broker_name, r.queue_id, r.min_offset, r.max_offset, format_ts(r.last_store_ts)) for r in status],
               ident="queues")
    return page(f"Topic {name}", f"{qd}<h2>Queues</h2>{qs}", session=session_of(request))


async def groups(request: web.Request) -> web.Response:
    admin = admin_of(request)
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
        return failed(request, "Consumer groups", exc)
    lag = sum_by(scrapes, "rocketmq_group_diff", "group")
    for g in lag:
        found.setdefault(str(g), {})
    rows = [
        (link("/group", "g", g), int(lag[g]) if g in lag else None, found[g].get("consume_enable"),
         found[g].get("consume_broadcast_enable"))
        for g in sorted(found)
    ]
    return page("Consumer groups", table(["Group", "Lag", "Consume Enable", "Broadcast Enable"], rows,
                                         ident="groups", raw=0), session=session_of(request))


async def group(request: web.Request) -> web.Response:
    admin = admin_of(request)
    name = request.query.get("g", "")
    try:
        progress = await admin.consumer_progress(name)
        members = await group_members(admin, name)
    except (ClientError, InvalidArgument) as exc:
        return failed(request, f"Consumer group {name}", exc)
    rows = [(q.topic, q.broker_name, q.queue_id, q.broker_offset, q.consumer_offset, q.lag, format_ts(q.last_ts))
            for q in progress.queues]
    body = table(["Topic", "Broker Name", "QID", "Broker Offset", "Consumer Offset", "Diff", "LastTime"], rows,
                 ident="progress")
    body += f'<p>Diff Total: <span id="total-lag">{progress.total_lag}</span></p><h2>Members</h2>'
    body += table(["Client Id", "Model", "Topics", "Broker"],
                  [(m.get("client_id"), m.get("model"), ",".join(m.get("topics") or ()), b) for b, m in members],
                  ident="members")
    return page(f"Consumer group {name}", body, session=session_of(request))


def _message_rows(msgs: Sequence[MessageView]) -> list[tuple[Any, ...]]:
    return [(m.broker_name, m.queue_id, m.queue_offset, m.msg_id, m.unique_id, m.tags or None,
             " ".join(m.keys) or None, format_ts(m.store_ts), body_text(m.body)) for m in msgs]


async def message(request: web.Request) -> web.Response:
    """Messages by id, key or unique key, read with the session's account: the broker shows a body
    only to an account with SUB on its topic (403 ``NO_PERMISSION`` otherwise)."""
    admin = admin_of(request)
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
    status = 200
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
        result, status = error_box(exc), error_status(exc)
    return page("Messages", form + result, status=status, session=session_of(request))


async def transfer(request: web.Request) -> web.Response:
    """Leadership transfer, signed with the session's account (the broker's ACL decides)."""
    form = await request.post()  # (the size is bounded by the app, the CSRF token checked by login_required)
    broker = str(form.get("broker", ""))
    target = str(form.get("target", "")).strip() or None
    try:
        result = await admin_of(request).transfer_leader(broker, target)
    except (ClientError, InvalidArgument) as exc:
        return failed(request, "Leadership transfer", exc)
    body = f'<p id="result">{esc(result.broker_name)}: the new leader is {esc(result.leader_id)}</p>'
    return page("Leadership transfer", body + '<p><a href="/">Back</a></p>', session=session_of(request))


async def api_live(request: web.Request) -> web.Response:
    try:
        data = await live(admin_of(request))
    except (ClientError, InvalidArgument) as exc:
        return web.json_response({"code": exc.code, "message": exc.message}, status=error_status(exc))
    return web.json_response(data, headers={"Cache-Control": "no-store"})


def make_app(access: ClusterAccess, sessions: Sessions | None = None) -> web.Application:
    app = web.Application(client_max_size=FORM_BYTES_MAX, middlewares=[error_pages, login_required])
    app[ACCESS_KEY] = access
    app[SESSIONS_KEY] = sessions if sessions is not None else Sessions()
    app.router.add_get("/login", login_page)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_get("/", overview)
    app.router.add_get("/topics", topics)
    app.router.add_get("/topic", topic)
    app.router.add_get("/groups", groups)
    app.router.add_get("/group", group)
    app.router.add_get("/message", message)
    app.router.add_post("/transfer", transfer)
    app.router.add_get("/api/live", api_live)
    app.router.add_static("/static", STATIC)

    async def close(app: web.Application) -> None:
        await app[SESSIONS_KEY].close()

    app.on_cleanup.append(close)
    return app


async def start(template: Admin, host: str, port: int, *, sessions: Sessions | None = None
                ) -> tuple[web.AppRunner, int]:
    """Serve on host:port (0: any free port); returns the runner and the bound port. ``template``
    says how to reach the cluster (its NameServers, timeout and TLS; its account is not used, and it
    is closed here: every page signs with its session's account)."""
    access = ClusterAccess(tuple(template.namesrv.addrs), template.transport.timeout_s,
                           template.transport.ssl_context)
    await template.close()
    runner = web.AppRunner(make_app(access, sessions), access_log=None)
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
    p.add_argument("--tls-ca", dest="tls_ca", metavar="FILE", default=None,
                   help="reach the cluster over HTTPS, trusting this CA (default: $DLEDGER_TLS_CA_FILE)")
    args = p.parse_args(argv)
    host, _, port_text = args.listen.rpartition(":")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        print(f"dledger-dashboard: --listen {args.listen!r} must be host:port", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        tls: Any = client_ssl_context(args.tls_ca) if args.tls_ca else FROM_ENV
        template = Admin(args.namesrv, timeout_s=args.timeout, credentials=None, tls=tls)
    except (InvalidArgument, CredentialsError, OSError, ssl.SSLError) as exc:
        print(f"dledger-dashboard: {exc}", file=sys.stderr)
        return 2

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        runner, bound = await start(template, host, int(port_text))
        log.info("dashboard on http://%s:%d (NameServers %s); sign in with an ACL account", host, bound,
                 ";".join(template.namesrv.addrs))
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
