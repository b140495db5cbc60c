"""Self-signed certificates made with the `openssl` command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def self_signed_cert(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A self-signed EC certificate (also its own CA) for 127.0.0.1; returns (cert, key)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key
