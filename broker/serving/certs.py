"""A private CA and server certificates for the HTTPS ports (the compose cluster, tests).

    python -m broker.serving.certs --dir DIR --name n0 --name namesrv1 --ip 127.0.0.1

writes DIR/ca.pem (the CA certificate clients trust: ``DLEDGER_TLS_CA_FILE``), DIR/server.pem
(one certificate whose subjectAltName lists every ``--name`` and ``--ip``) and DIR/server.key
(0600). The CA's private key is used once and never written. Production clusters should use
certificates from their own PKI; this exists so that the compose cluster runs TLS out of the box.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_certs(out_dir: str, dns_names: Sequence[str], ips: Sequence[str] = ("127.0.0.1",)) -> dict[str, str]:
    """Write ca.pem, server.pem and server.key (0600) into ``out_dir``; returns their paths."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("dledger-mq private CA"))
        .issuer_name(_name("dledger-mq private CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(dns_names[0] if dns_names else ips[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in ("ca.pem", "server.pem", "server.key")}
    _write(paths["ca.pem"], ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(paths["server.pem"], cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(
        paths["server.key"],
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        0o600,
    )
    return paths


def _write(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path + ".tmp", mode)
    os.replace(path + ".tmp", path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m broker.serving.certs",
                                description="Make a private CA and a server cert.")
    p.add_argument("--dir", required=True)
    p.add_argument("--name", action="append", default=[], help="a DNS name of the servers (repeatable)")
    p.add_argument("--ip", action="append", default=[], help="an IP address of the servers (repeatable)")
    args = p.parse_args(argv)
    if not args.name and not args.ip:
        print("broker.serving.certs: give at least one --name or --ip", file=sys.stderr)
        return 2
    try:
        paths = make_certs(args.dir, args.name, args.ip or [])
    except ValueError as exc:
        print(f"broker.serving.certs: {exc}", file=sys.stderr)
        return 2
    print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
