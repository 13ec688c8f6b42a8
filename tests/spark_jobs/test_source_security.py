"""The dledger-mq data source's credentials and TLS (no cluster, no Spark): options, the SDK's
environment rules as the fallback, files refused like the SDK refuses them, what travels to the
executors (pickled), the transports built from it, and the messages for refused requests."""

from __future__ import annotations

import os
import pickle
import ssl
from pathlib import Path
from typing import Any

import pytest

from broker.client.transport import ClientError, client_ssl_context
from broker.protocol.auth import Credentials, credentials_text
from broker.serving.certs import make_certs
from spark_jobs.source.options import SourceOptionError, parse_options
from spark_jobs.source.security import SourceAuthError, SourceSecurity, refusal

ADMIN = Credentials("admin", "admin-secret-0001")


def opts(env: dict[str, str] | None = None, **kv: str) -> Any:
    return parse_options({"namesrv": "127.0.0.1:19876", "topic": "T", **kv}, "batch", env=env or {})


def raw_opts(kv: dict[str, str]) -> Any:
    return parse_options({"namesrv": "127.0.0.1:19876", "topic": "T", **kv}, "batch", env={})


def creds_file(path: Path, creds: Credentials = ADMIN, mode: int = 0o600) -> str:
    path.write_text(credentials_text(creds))
    os.chmod(path, mode)
    return str(path)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_certs(str(tmp_path_factory.mktemp("tls")), ["localhost"])["ca.pem"]


# -- credentials -------------------------------------------------------------------------------------
def test_access_key_and_secret_key_options() -> None:
    c = opts(accessKey="reader", secretKey="reader-secret").security.credentials
    assert c == Credentials("reader", "reader-secret") and isinstance(c, Credentials)
    assert "reader-secret" not in repr(opts(accessKey="reader", secretKey="reader-secret"))
    for kv, message in [
        ({"accessKey": "reader"}, "go together"),
        ({"secretKey": "reader-secret"}, "go together"),
        ({"accessKey": "reader", "secretKey": "short"}, r"accessKey/secretKey: .*at least 8 characters"),
        ({"accessKey": "bad key", "secretKey": "reader-secret"}, r"accessKey/secretKey: accessKey 'bad key' must"),
    ]:
        with pytest.raises(SourceOptionError, match=message):
            raw_opts(kv)


def test_credentials_file_is_read_like_the_sdk_reads_it(tmp_path: Path) -> None:
    path = creds_file(tmp_path / "tools.yml")
    assert opts(credentialsFile=path).security.credentials == ADMIN
    os.chmod(path, 0o644)
    with pytest.raises(SourceOptionError, match=r"credentialsFile .*tools.yml: mode 644 lets others read it: chmod"):
        opts(credentialsFile=path)
    os.chmod(path, 0o600)
    with pytest.raises(SourceOptionError, match="not both"):
        opts(credentialsFile=path, accessKey="a", secretKey="b")
    with pytest.raises(SourceOptionError, match=r"credentialsFile .*missing.yml: No such file"):
        opts(credentialsFile=str(tmp_path / "missing.yml"))
    (tmp_path / "half.yml").write_text("accessKey: only\n")
    os.chmod(tmp_path / "half.yml", 0o600)
    with pytest.raises(SourceOptionError, match="must hold exactly accessKey and secretKey"):
        opts(credentialsFile=str(tmp_path / "half.yml"))


def test_without_options_the_sdks_environment_rules_apply(tmp_path: Path) -> None:
    pair = {"DLEDGER_ACCESS_KEY": "envkey", "DLEDGER_SECRET_KEY": "env-secret-1"}
    assert opts(env=pair).security.credentials == Credentials("envkey", "env-secret-1")
    other = Credentials("filekey", "file-secret-1")
    from_file = {"DLEDGER_CREDENTIALS_FILE": creds_file(tmp_path / "env.yml", other)}
    assert opts(env=from_file).security.credentials == other
    assert opts(env={**pair, **from_file}).security.credentials == Credentials("envkey", "env-secret-1")
    # an option wins over the environment
    assert opts(env=pair, accessKey="reader", secretKey="reader-secret").security.credentials.access_key == "reader"
    with pytest.raises(SourceOptionError, match=r"no credential option .*set both DLEDGER_ACCESS_KEY"):
        opts(env={"DLEDGER_ACCESS_KEY": "envkey"})
    os.chmod(tmp_path / "env.yml", 0o640)
    with pytest.raises(SourceOptionError, match=r"no credential option .*env.yml: mode 640"):
        opts(env=from_file)
    assert opts(env={}).security.credentials is None


# -- TLS ---------------------------------------------------------------------------------------------
def test_tls_options(ca: str, tmp_path: Path) -> None:
    assert opts().security == SourceSecurity() and opts().security.ssl_context() is None
    on = opts(tls="true").security
    assert on.tls and on.ca_pem is None
    ctx = on.ssl_context()
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    with_ca = opts(tlsCaFile=ca).security
    assert with_ca.tls and with_ca.ca_file == ca and with_ca.ca_pem == Path(ca).read_text()
    assert with_ca.ca_pem is not None and with_ca.ca_pem not in repr(with_ca)
    with pytest.raises(SourceOptionError, match="tlsCaFile is for HTTPS: drop tls=false"):
        opts(tls="false", tlsCaFile=ca)
    with pytest.raises(SourceOptionError, match="tls='maybe': expected true or false"):
        opts(tls="maybe")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(SourceOptionError, match=r"tlsCaFile .*junk.pem: not a PEM CA file"):
        opts(tlsCaFile=str(tmp_path / "junk.pem"))
    with pytest.raises(SourceOptionError, match=r"tlsCaFile .*nope.pem: No such file"):
        opts(tlsCaFile=str(tmp_path / "nope.pem"))


def test_tls_from_the_environment_unless_an_option_says_otherwise(ca: str) -> None:
    env_ca = opts(env={"DLEDGER_TLS_CA_FILE": ca}).security
    assert env_ca.tls and env_ca.ca_file == ca and env_ca.ca_pem is not None
    assert opts(env={"DLEDGER_TLS": "true"}).security == SourceSecurity(tls=True)
    assert opts(env={"DLEDGER_TLS": "no"}).security == SourceSecurity()
    assert opts(env={"DLEDGER_TLS_CA_FILE": ca}, tls="false").security == SourceSecurity()
    assert opts(env={"DLEDGER_TLS_CA_FILE": ca}, tls="true").security == SourceSecurity(tls=True)


def test_the_context_from_a_ca_text_is_the_sdks_from_the_file(ca: str) -> None:
    ours = opts(tlsCaFile=ca).security.ssl_context()
    sdk = client_ssl_context(ca)
    assert ours is not None
    assert (ours.minimum_version, ours.verify_mode, ours.check_hostname) == (
        sdk.minimum_version, sdk.verify_mode, sdk.check_hostname
    )
    assert ours.get_ca_certs() == sdk.get_ca_certs() and len(ours.get_ca_certs()) == 1


# -- what travels to the executors -------------------------------------------------------------------
def test_options_pickle_with_their_credentials_and_ca(ca: str, tmp_path: Path) -> None:
    o = opts(credentialsFile=creds_file(tmp_path / "c.yml"), tlsCaFile=ca)
    os.remove(tmp_path / "c.yml")  # an executor elsewhere has neither file
    back = pickle.loads(pickle.dumps(o))
    assert back == o and back.security.credentials == ADMIN
    ctx = back.security.ssl_context()
    assert ctx is not None and len(ctx.get_ca_certs()) == 1


def test_transports_carry_exactly_what_the_driver_resolved(ca: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # an executor's own environment is never consulted: None means unsigned, plain means plain
    monkeypatch.setenv("DLEDGER_ACCESS_KEY", "executor-env")
    monkeypatch.setenv("DLEDGER_SECRET_KEY", "executor-secret")
    monkeypatch.setenv("DLEDGER_TLS", "true")
    bare = SourceSecurity().transport(1.0)
    assert bare.credentials is None and bare.ssl_context is None and bare.scheme == "http"
    signed = opts(accessKey="reader", secretKey="reader-secret", tlsCaFile=ca).security.transport(1.0)
    assert signed.credentials == Credentials("reader", "reader-secret") and signed.scheme == "https"
    assert signed.ssl_context is not None and len(signed.ssl_context.get_ca_certs()) == 1


# -- refusals ----------------------------------------------------------------------------------------
def test_refusals_say_what_to_do() -> None:
    def err(code: str, status: int) -> ClientError:
        return ClientError(code, "the broker's words", status=status, addr="127.0.0.1:1")

    none, reader = SourceSecurity(), SourceSecurity(Credentials("reader", "reader-secret"))
    e = refusal(err("NO_CREDENTIALS", 401), none, "the pull of T@G:0 at 5")
    assert isinstance(e, SourceAuthError) and e.code == "NO_CREDENTIALS"
    assert str(e) == (
        "NO_CREDENTIALS: the pull of T@G:0 at 5 was refused: the broker's words (127.0.0.1:1); the brokers run "
        "with ACL and the data source has no credentials: give the options accessKey and secretKey, or "
        "credentialsFile (else, where the driver runs, DLEDGER_ACCESS_KEY and DLEDGER_SECRET_KEY, or "
        "DLEDGER_CREDENTIALS_FILE)"
    )
    assert str(refusal(err("SIGNATURE_INVALID", 401), reader, "x")).endswith(
        "the cluster does not know accessKey 'reader', or its secretKey is wrong"
    )
    assert str(refusal(err("NO_PERMISSION", 403), reader, "x")).endswith(
        "accessKey 'reader' may not read this: the data source needs SUB on every topic it reads"
    )
    assert "clocks" in str(refusal(err("TIMESTAMP_OUT_OF_WINDOW", 401), reader, "x"))
    assert str(refusal(err("REPLAYED_REQUEST", 401), reader, "x")).startswith("REPLAYED_REQUEST: x was refused")
