"""The pure cores of issue 10's ACL: signatures, the nonce window, plain_acl.yml, permission decisions,
credentials files — no sockets, time passed in."""

from __future__ import annotations

import os
from typing import Any

import pytest

from broker.protocol import auth
from broker.protocol.auth import AuthError, Credentials, NonceWindow, Verifier
from broker.serving import acl
from broker.serving.acl import AclError, AclWatcher, Perm, parse_acl
from tests.acl_fixtures import write_acl

CREDS = Credentials("alice", "alice-secret-1")
NOW = 1_700_000_000_000
SCOPE = auth.broker_scope("DefaultCluster", "RaftNode00", "n0")


def verifier(window_ms: int = 1000, nonces_max: int = 100, future_ms: int = 1000) -> Verifier:
    return Verifier({"alice": "alice-secret-1"}.get, NonceWindow(window_ms, nonces_max, future_ms), scope=SCOPE)


def header(ts: int = NOW, nonce: str | None = None, body: bytes = b"{}", target: str = "/v1/send",
           scope: str = SCOPE) -> str:
    return auth.authorization(CREDS, "POST", target, body, ts, nonce, scope=scope)


def code(fn: Any) -> str:
    with pytest.raises(AuthError) as e:
        fn()
    return e.value.code


def test_signature_binds_method_target_body_and_key() -> None:
    v = verifier()
    assert v.verify(header(), "POST", "/v1/send", b"{}", NOW) == "alice"
    h = header()
    assert code(lambda: v.verify(h, "POST", "/v1/send", b"{ }", NOW)) == "BODY_DIGEST_MISMATCH"
    assert code(lambda: v.verify(h, "GET", "/v1/send", b"{}", NOW)) == "SIGNATURE_INVALID"
    assert code(lambda: v.verify(h, "POST", "/v1/send?x=1", b"{}", NOW)) == "SIGNATURE_INVALID"
    wrong = auth.authorization(Credentials("alice", "not-her-secret"), "POST", "/v1/send", b"{}", NOW, scope=SCOPE)
    assert code(lambda: v.verify(wrong, "POST", "/v1/send", b"{}", NOW)) == "SIGNATURE_INVALID"
    other = auth.authorization(Credentials("mallory", "alice-secret-1"), "POST", "/v1/send", b"{}", NOW, scope=SCOPE)
    assert code(lambda: v.verify(other, "POST", "/v1/send", b"{}", NOW)) == "SIGNATURE_INVALID"
    for bad in (None, "", "Basic YWxpY2U6eA==", header() + "\n", header().replace("Nonce=", "Nonce=zz"), "x" * 5000):
        assert code(lambda bad=bad: v.verify(bad, "POST", "/v1/send", b"{}", NOW)) in (
            "NO_CREDENTIALS", "BAD_AUTHORIZATION")


def test_a_signature_names_its_server_and_is_checked_from_the_head() -> None:
    """Finding 3 of issue 23: a request signed for one replica is refused by every other one (and
    the refusal names the server's scope, so a client signs again for it); the body's hash is
    declared in the head, so the signature is verified before a byte of the body is read."""
    v = verifier()
    for_n1 = header(scope=auth.broker_scope("DefaultCluster", "RaftNode00", "n1"))
    with pytest.raises(AuthError) as e:
        v.verify(for_n1, "POST", "/v1/send", b"{}", NOW)
    assert (e.value.code, e.value.extra) == ("WRONG_SCOPE", {"scope": SCOPE})
    assert code(lambda: v.verify(header(scope=auth.namesrv_scope("abc")), "POST", "/v1/send", b"{}", NOW)) == (
        "WRONG_SCOPE")
    signed = v.verify_head(header(body=b"big body"), "POST", "/v1/send", NOW)  # no body needed yet
    auth.check_body(signed, b"big body")
    assert code(lambda: auth.check_body(signed, b"big bodY")) == "BODY_DIGEST_MISMATCH"
    # format 1 (no Scope, no body hash) is refused with its reason
    msg = "\n".join(("DLEDGER-HMAC-SHA256", "alice", str(NOW), "0" * 32, "POST", "/v1/send", auth.body_digest(b"{}")))
    v1 = (f"DLEDGER-HMAC-SHA256 AccessKey=alice, Timestamp={NOW}, Nonce={'0' * 32}, "
          f"Signature={auth.signature('alice-secret-1', msg.encode())}")
    with pytest.raises(AuthError) as e:
        v.verify(v1, "POST", "/v1/send", b"{}", NOW)
    assert e.value.code == "BAD_AUTHORIZATION" and "Scope" in e.value.message
    with pytest.raises(ValueError):
        header(scope="a, b")  # a scope never holds the header's separator


def test_timestamp_window_and_replays() -> None:
    v = verifier(window_ms=1000, future_ms=200)
    h = header(ts=NOW)
    assert v.verify(h, "POST", "/v1/send", b"{}", NOW + 1000) == "alice"
    assert code(lambda: v.verify(h, "POST", "/v1/send", b"{}", NOW + 1000)) == "REPLAYED_REQUEST"
    assert code(lambda: v.verify(header(ts=NOW), "POST", "/v1/send", b"{}", NOW + 1001)) == "TIMESTAMP_OUT_OF_WINDOW"
    assert code(lambda: v.verify(header(ts=NOW + 201), "POST", "/v1/send", b"{}", NOW)) == "TIMESTAMP_OUT_OF_WINDOW"
    assert v.verify(header(ts=NOW + 200), "POST", "/v1/send", b"{}", NOW) == "alice"  # the future bound
    with pytest.raises(AuthError) as e:
        v.verify(header(ts=NOW + 5000), "POST", "/v1/send", b"{}", NOW)
    assert e.value.extra == {"server_time_ms": NOW}  # so that a client corrects its clock
    # an expired nonce is forgotten; the request itself is refused by its timestamp anyway
    assert code(lambda: v.verify(h, "POST", "/v1/send", b"{}", NOW + 5000)) == "TIMESTAMP_OUT_OF_WINDOW"
    assert v.verify(header(ts=NOW + 5000), "POST", "/v1/send", b"{}", NOW + 5000) == "alice"
    assert len(v.nonces) == 1


def test_a_full_nonce_window_refuses_what_it_may_have_forgotten() -> None:
    w = NonceWindow(10_000, 3)
    for i in range(3):
        w.admit("a", f"n{i}", NOW + i, NOW)
    w.admit("a", "n3", NOW + 3, NOW)  # evicts n0 (ts NOW): a's floor = NOW
    assert len(w) == 3 and w.floor_of("a") == NOW and w.evicted == 1
    with pytest.raises(AuthError) as e:
        w.admit("a", "n0", NOW, NOW)  # the evicted one replayed: refused by the floor
    assert e.value.code == "REQUEST_TOO_OLD"
    with pytest.raises(AuthError):
        w.admit("a", "n2", NOW + 2, NOW)  # still remembered
    w.admit("a", "n9", NOW + 9, NOW)
    assert len(w) <= 3


def test_one_accounts_clock_never_moves_another_accounts_window() -> None:
    """Finding 4 of issue 23: a SUB account sending pings stamped +290 s (accepted by a ±300 s window
    then) filled the shared window, whose floor then refused every other account REQUEST_TOO_OLD for
    minutes. Now stamps more than 10 s ahead are refused, and the window is per access key: whatever
    one key sends, another key's fresh requests pass. (Positional arguments: the same call on the
    code before the fix, whose window was shared, fails at the first other-account request.)"""
    w = NonceWindow(300_000, 50)
    for i in range(200):  # far more than the window holds
        for ahead_ms in (290_000, 9_000):
            try:
                w.admit("consumer", f"p{ahead_ms}-{i}", NOW + ahead_ms, NOW)
            except AuthError as exc:
                assert exc.code in ("TIMESTAMP_OUT_OF_WINDOW", "REQUEST_TOO_OLD")
    for k, account in enumerate(("admin", "producer", "orders-app")):
        for i in range(100):
            w.admit(account, f"{account}-{i}", NOW + k + i, NOW)  # none refused
    # the consumer moved its own key's floor (at most 10 s ahead), nobody else's
    assert w.floor_of("consumer") == NOW + 9_000 and w.floor_of("admin") < NOW + 100


def test_auth_future_bound_is_tight() -> None:
    assert auth.FUTURE_MS_DEFAULT <= 10_000 < auth.WINDOW_MS_DEFAULT
    w = NonceWindow()
    assert code(lambda: w.admit("consumer", "x" * 32, NOW + 290_000, NOW)) == "TIMESTAMP_OUT_OF_WINDOW"


def test_secret_is_never_printed() -> None:
    assert "alice-secret-1" not in repr(CREDS)
    with pytest.raises(ValueError):
        Credentials("alice", "short")
    with pytest.raises(ValueError):
        Credentials("bad key\n", "long-enough-secret")


SAMPLE = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.0/16
accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB
  - accessKey: rocketmq2
    secretKey: "12345678"
    admin: true
"""


def test_rocketmq_sample_file_and_decisions() -> None:
    cfg = parse_acl(SAMPLE, "plain_acl.yml")
    user, admin = cfg.accounts["RocketMQ"], cfg.accounts["rocketmq2"]
    assert user.secret_key == "12345678"
    assert acl.topic_perm(user, "topicA") == Perm.DENY
    assert acl.topic_perm(user, "topicB") == Perm.ANY
    assert acl.topic_perm(user, "topicC") == Perm.SUB
    assert acl.topic_perm(user, "other") == Perm.DENY
    assert acl.group_perm(user, "other") == Perm.SUB and acl.group_perm(user, "groupA") == Perm.DENY
    assert acl.topic_perm(user, "%RETRY%groupB") == Perm.ANY  # retry topics follow their group
    assert acl.topic_perm(admin, "anything") == Perm.ANY
    acl.check(user, topics={"topicB": Perm.PUB}, groups={"groupC": Perm.SUB})
    for kwargs in ({"topics": {"topicC": Perm.PUB}}, {"groups": {"groupA": Perm.SUB}}, {"admin": True},
                   {"topics": {"other": Perm.SUB}}):
        with pytest.raises(AuthError) as e:
            acl.check(user, **kwargs)
        assert e.value.status == 403 and e.value.code == "NO_PERMISSION"
    acl.check(admin, admin=True, topics={"x": Perm.ANY})
    assert cfg.white_listed("10.10.103.7") and cfg.white_listed("192.168.4.4")
    assert cfg.white_listed("::ffff:10.10.103.1")
    assert not cfg.white_listed("10.10.104.7") and not cfg.white_listed("127.0.0.1") and not cfg.white_listed(None)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("accounts: [{accessKey: a, secretKey: short}]", "secretKey"),
        ("accounts: [{accessKey: 'a b', secretKey: longenough}]", "accessKey"),
        ("accounts: [{accessKey: a, secretKey: longenough, defaultTopicPerm: ALL}]", "permission"),
        ("accounts: [{accessKey: a, secretKey: longenough, topicPerms: [x]}]", "name=PERM"),
        ("accounts: [{accessKey: a, secretKey: longenough, whiteRemoteAddress: 1.2.3.4}]", "unknown key"),
        ("accounts: [{accessKey: a, secretKey: longenough}, {accessKey: a, secretKey: longenough}]", "twice"),
        ("acounts: []", "unknown key"),
        ("globalWhiteRemoteAddresses: [nonsense]", "white address"),
        ("accounts: [{accessKey: a, secretKey: longenough, admin: 'yes'}]", "admin"),
        ("- just\n- a list", "map"),
        ("accounts: [a: [", "not YAML"),
    ],
)
def test_bad_acl_files_are_refused_with_the_entry_named(text: str, needle: str) -> None:
    with pytest.raises(AclError) as e:
        parse_acl(text, "f.yml")
    assert needle in str(e.value) and "f.yml" in str(e.value)


def test_watcher_reloads_on_change_only(tmp_path: Any) -> None:
    path = str(tmp_path / "acl.yml")
    write_acl(path, {"accounts": [{"accessKey": "a", "secretKey": "secret-aaaa"}]})
    w = AclWatcher(path, rehash_every=1000)
    assert not w.poll() and w.reloads == 0
    write_acl(path, {"accounts": [{"accessKey": "b", "secretKey": "secret-bbbb"}]})
    assert w.poll() and set(w.current.accounts) == {"b"}
    # same size, same mtime, new content: caught by the periodic re-hash
    st = os.stat(path)
    write_acl(path, {"accounts": [{"accessKey": "c", "secretKey": "secret-cccc"}]})
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    w2 = AclWatcher(path, rehash_every=2)
    write_acl(path, {"accounts": [{"accessKey": "d", "secretKey": "secret-dddd"}]})
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    w2._stamp = w2._stamp  # unchanged view of the stamp
    assert w2.poll() or w2.poll()
    assert set(w2.current.accounts) == {"d"}
    os.remove(path)
    assert not w.poll() and set(w.current.accounts) == {"b"}  # a missing file keeps the rules


def test_credentials_files_and_env(tmp_path: Any) -> None:
    path = tmp_path / "admin.yml"
    path.write_text(auth.credentials_text(CREDS))
    os.chmod(path, 0o644)
    with pytest.raises(auth.CredentialsError) as e:
        auth.load_credentials(path)
    assert "chmod 600" in str(e.value)
    os.chmod(path, 0o600)
    assert auth.load_credentials(path) == CREDS
    assert auth.credentials_from_env({"DLEDGER_CREDENTIALS_FILE": str(path)}) == CREDS
    assert auth.credentials_from_env({"DLEDGER_ACCESS_KEY": "bob", "DLEDGER_SECRET_KEY": "bob-secret-1"}) == (
        Credentials("bob", "bob-secret-1"))
    assert auth.credentials_from_env({}) is None
    with pytest.raises(auth.CredentialsError):
        auth.credentials_from_env({"DLEDGER_ACCESS_KEY": "bob"})
    path.write_text("accessKey: a\n")
    with pytest.raises(auth.CredentialsError):
        auth.load_credentials(path)
