"""A throwaway PKI for TLS tests: a CA, a server certificate for 127.0.0.1
and localhost, and a client certificate, written as PEM files (the layout of
a kubernetes.io/tls Secret: ca.crt, tls.crt, tls.key)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None,
          issuer_key: ec.EllipticCurvePrivateKey | None, *, ca: bool) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_pki(directory: Path) -> dict[str, Path]:
    """Files ``ca``, ``server``, ``server_key``, ``client``, ``client_key``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("primus-test-ca", ca_key, None, None, ca=True)
    out = {"ca": directory / "ca.crt"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for stem in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(f"primus-{stem}", key, ca.subject, ca_key, ca=False)
        out[stem], out[f"{stem}_key"] = directory / f"{stem}.crt", directory / f"{stem}.key"
        out[stem].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out[f"{stem}_key"].write_bytes(_pem_key(key))
    return out
