"""Loopback ports and waiting for an HTTP endpoint to answer."""

from __future__ import annotations

import socket
import ssl
import time
import urllib.request


def free_port() -> int:
    """A loopback port that was free a moment ago (bound, read and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def closed_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused."""
    return free_port()


def wait_http(url: str, timeout: float = 20, context: ssl.SSLContext | None = None) -> str:
    """Poll `url` until it answers 2xx; return the body. Raises the last error at `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as resp:
                return str(resp.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
