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


def verifier(window_ms: int = 1000, nonces_max: int = 100) -> Verifier:
    return Verifier({"alice": "alice-secret-1"}.get, NonceWindow(window_ms, nonces_max))


def header(ts: int = NOW, nonce: str | None = None, body: bytes = b"{}", target: str = "/v1/send") -> str:
    return auth.authorization(CREDS, "POST", target, body, ts, nonce)


def code(fn: Any) -> str:
    with pytest.raises(AuthError) as e:
        fn()
    return e.value.code


def test_signature_binds_method_target_body_and_key() -> None:
    v = verifier()
    assert v.verify(header(), "POST", "/v1/send", b"{}", NOW) == "alice"
    h = header()
    assert code(lambda: v.verify(h, "POST", "/v1/send", b"{ }", NOW)) == "SIGNATURE_INVALID"
    assert code(lambda: v.verify(h, "GET", "/v1/send", b"{}", NOW)) == "SIGNATURE_INVALID"
    assert code(lambda: v.verify(h, "POST", "/v1/send?x=1", b"{}", NOW)) == "SIGNATURE_INVALID"
    wrong = auth.authorization(Credentials("alice", "not-her-secret"), "POST", "/v1/send", b"{}", NOW)
    assert code(lambda: v.verify(wrong, "POST", "/v1/send", b"{}", NOW)) == "SIGNATURE_INVALID"
    other = auth.authorization(Credentials("mallory", "alice-secret-1"), "POST", "/v1/send", b"{}", NOW)
    assert code(lambda: v.verify(other, "POST", "/v1/send", b"{}", NOW)) == "SIGNATURE_INVALID"
    for bad in (None, "", "Basic YWxpY2U6eA==", header() + "\n", header().replace("Nonce=", "Nonce=zz"), "x" * 5000):
        assert code(lambda bad=bad: v.verify(bad, "POST", "/v1/send", b"{}", NOW)) in (
            "NO_CREDENTIALS", "BAD_AUTHORIZATION")


def test_timestamp_window_and_replays() -> None:
    v = verifier(window_ms=1000)
    h = header(ts=NOW)
    assert v.verify(h, "POST", "/v1/send", b"{}", NOW + 1000) == "alice"
    assert code(lambda: v.verify(h, "POST", "/v1/send", b"{}", NOW + 1000)) == "REPLAYED_REQUEST"
    assert code(lambda: v.verify(header(ts=NOW), "POST", "/v1/send", b"{}", NOW + 1001)) == "TIMESTAMP_OUT_OF_WINDOW"
    assert code(lambda: v.verify(header(ts=NOW + 1001), "POST", "/v1/send", b"{}", NOW)) == "TIMESTAMP_OUT_OF_WINDOW"
    # an expired nonce is forgotten; the request itself is refused by its timestamp anyway
    assert code(lambda: v.verify(h, "POST", "/v1/send", b"{}", NOW + 5000)) == "TIMESTAMP_OUT_OF_WINDOW"
    assert v.verify(header(ts=NOW + 5000), "POST", "/v1/send", b"{}", NOW + 5000) == "alice"
    assert len(v.nonces) == 1


def test_a_full_nonce_window_refuses_what_it_may_have_forgotten() -> None:
    w = NonceWindow(window_ms=10_000, entries_max=3)
    for i in range(3):
        w.admit("a", f"n{i}", NOW + i, NOW)
    w.admit("a", "n3", NOW + 3, NOW)  # evicts n0 (ts NOW): floor = NOW
    assert len(w) == 3 and w.floor_ms == NOW and w.evicted == 1
    with pytest.raises(AuthError) as e:
        w.admit("a", "n0", NOW, NOW)  # the evicted one replayed: refused by the floor
    assert e.value.code == "REQUEST_TOO_OLD"
    with pytest.raises(AuthError):
        w.admit("a", "n2", NOW + 2, NOW)  # still remembered
    w.admit("a", "n9", NOW + 9, NOW)
    assert len(w) <= 3


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
