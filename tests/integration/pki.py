"""Throw-away certificates for the extender's TLS (openssl CLI, EC P-256, one day): a CA, a server
certificate for 127.0.0.1/localhost, a client certificate the CA signed (kube-scheduler's), and a client
certificate of another CA (a stranger's)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class ExtenderPki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # signed by another CA
    stranger_key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    cert, key = d / f"{name}.crt", d / f"{name}.key"
    _openssl(
        "req", "-x509", *_EC, "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}"
    )
    return cert, key


def _issue(d: Path, name: str, ca: tuple[Path, Path], subject: str, ext: str) -> tuple[Path, Path]:
    cert, key, csr, extfile = d / f"{name}.crt", d / f"{name}.key", d / f"{name}.csr", d / f"{name}.ext"
    extfile.write_text(ext)
    _openssl("req", "-new", *_EC, "-keyout", str(key), "-out", str(csr), "-subj", subject)
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-out", str(cert), "-days", "1", "-extfile", str(extfile))  # fmt: skip
    return cert, key


def make_extender_pki(directory: Path) -> ExtenderPki:
    """Certificates under ``directory``; skips the test when openssl is missing."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not on PATH (Debian package 'openssl')")
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "extender-ca")
    other = _ca(directory, "stranger-ca")
    server = _issue(
        directory,
        "extender",
        ca,
        "/CN=gpu-topology-extender",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    client = _issue(
        directory, "kube-scheduler", ca, "/CN=gpu-topology-scheduler", "extendedKeyUsage=clientAuth\n"
    )
    stranger = _issue(directory, "stranger", other, "/CN=stranger", "extendedKeyUsage=clientAuth\n")
    return ExtenderPki(
        ca=ca[0],
        server_cert=server[0],
        server_key=server[1],
        client_cert=client[0],
        client_key=client[1],
        stranger_cert=stranger[0],
        stranger_key=stranger[1],
    )
