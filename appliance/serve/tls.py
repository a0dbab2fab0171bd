"""TLS for the inference server and the control API: a self-signed certificate made once, or the site's.

Sites with their own CA give `serve.tls_cert` and `serve.tls_key` instead. The private
key file is created 0600 before a byte is written to it.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from appliance.core import clock
from appliance.core.config import Settings
from appliance.store import keys

VALID_DAYS = 825  # the longest validity browsers and most clients accept


def uvicorn_options(settings: Settings) -> dict[str, str]:
    """uvicorn's TLS options: the site's certificate and key if configured, else the self-signed pair."""
    serve = settings.serve
    cert, key = (serve.tls_cert, serve.tls_key) if serve.tls_cert else self_signed(settings.state_dir)
    return {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}


def self_signed(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) in directory, made on first use for this host name, localhost and 127.0.0.1."""
    cert_path, key_path = directory / "tls-cert.pem", directory / "tls-key.pem"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    host = socket.gethostname()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "appliance (self-signed)")])
    now = clock.now()
    names = [x509.DNSName(host), x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Each a new 0600 file renamed into place: never through a link left at that name, never an older file's mode.
    keys.write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()).decode())
    keys.write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM).decode())
    return cert_path, key_path
