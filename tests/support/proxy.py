"""A real forward proxy for the proxy tests: Debian's tinyproxy on a loopback port.

    with tinyproxy(tmp_path, connect_ports=[tls_port], auth=("user", "pass")) as proxy:
        proxy.url        # http://127.0.0.1:PORT
        proxy.requests() # the request lines it logged ("POST http://...", "CONNECT host:port")

It listens on 127.0.0.1 only, allows 127.0.0.1 only, opens CONNECT tunnels to the given ports
only, and logs every request line to a file the test reads. scripts/setup-tinyproxy.sh
installs it (scripts/test exports its path as TINYPROXY); where it is missing the tests skip,
and fail under CI (`deploy.missing_tool`).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.deploy import missing_tool
from tests.support.net import free_port

START_SECONDS = 10.0
_REQUEST = re.compile(r"Request \(file descriptor \d+\): (.*)$")


def tinyproxy_binary() -> str:
    found = os.environ.get("TINYPROXY") or shutil.which("tinyproxy")
    if found is None:
        missing_tool("tinyproxy not installed (scripts/setup-tinyproxy.sh)")
        raise AssertionError("unreachable")
    return found


@dataclass(frozen=True)
class Proxy:
    url: str
    log: Path

    def requests(self) -> list[str]:
        """The request lines the proxy logged so far, in order."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [m.group(1).strip() for line in text.splitlines() if (m := _REQUEST.search(line))]


@contextmanager
def tinyproxy(
    folder: Path, *, connect_ports: Sequence[int] = (), auth: tuple[str, str] | None = None
) -> Iterator[Proxy]:
    """tinyproxy on a free loopback port, in the foreground, stopped on exit."""
    port = free_port()
    log = folder / f"tinyproxy-{port}.log"
    lines = [
        f"Port {port}", "Listen 127.0.0.1", "Timeout 30", f'LogFile "{log}"', "LogLevel Connect",
        "MaxClients 50", "Allow 127.0.0.1", "DisableViaHeader Yes",
        *(f"ConnectPort {p}" for p in connect_ports),
        *([f"BasicAuth {auth[0]} {auth[1]}"] if auth else []),
    ]  # fmt: skip
    config = folder / f"tinyproxy-{port}.conf"
    config.write_text("\n".join(lines) + "\n")
    process = subprocess.Popen(
        [tinyproxy_binary(), "-d", "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_listening(port, process)
        yield Proxy(f"http://127.0.0.1:{port}", log)
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_listening(port: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            error = process.stderr.read() if process.stderr else ""
            raise RuntimeError(f"tinyproxy exited with {process.returncode}: {error[-500:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"tinyproxy not listening on {port} within {START_SECONDS}s")
