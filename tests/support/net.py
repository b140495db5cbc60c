"""Loopback ports, waiting for an HTTP endpoint to answer, and watching a daemon's health."""

from __future__ import annotations

import socket
import ssl
import threading
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


class HealthWatch:
    """Asks a daemon's `/-/healthy` every `every` seconds in a thread while entered; keeps each
    answer's latency (seconds) or failure (anything but a 200 within 5 s)."""

    def __init__(self, port: int, every: float = 0.02) -> None:
        self.url = f"http://127.0.0.1:{port}/-/healthy"
        self.every = every
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=5) as resp:
                    resp.read()
                    assert resp.status == 200
                self.latencies.append(time.monotonic() - started)
            except Exception as exc:  # every failure is the finding
                self.failures.append(repr(exc))
