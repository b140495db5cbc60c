"""A real DNS server for the `dns:` discovery tests: Debian's dnsmasq on a loopback port.

`Dnsmasq` serves the zone `test.` alone (names outside it are REFUSED, names in it that the
hosts file lacks are NXDOMAIN), A/AAAA records from a hosts file the test rewrites (`hosts`,
then SIGHUP: dnsmasq reads it again) and fixed SRV records. scripts/setup-dnsmasq.sh installs
it (scripts/test exports its path as DNSMASQ); where it is missing the tests skip, and fail
under CI (`deploy.missing_tool`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support.deploy import missing_tool


def dnsmasq_binary() -> str:
    found = (
        os.environ.get("DNSMASQ")
        or shutil.which("dnsmasq")
        or next((p for p in ("/usr/sbin/dnsmasq", "/sbin/dnsmasq") if os.access(p, os.X_OK)), None)
    )
    if found is None:
        missing_tool("dnsmasq not installed (scripts/setup-dnsmasq.sh)")
        raise AssertionError("unreachable")
    return found


def _free_udp_and_tcp_port() -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            port = int(udp.getsockname()[1])
            with socket.socket() as tcp:
                try:
                    tcp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no free port for dnsmasq")


class Dnsmasq:
    def __init__(self, folder: Path, process: subprocess.Popen[str], port: int) -> None:
        self.folder = folder
        self.process = process
        self.port = port
        self.server = f"127.0.0.1:{port}"

    def hosts(self, lines: Sequence[str]) -> None:
        """Serve these `ADDRESS NAME` lines from now on (written whole, then SIGHUP)."""
        temporary = self.folder / "hosts.new"
        temporary.write_text("".join(f"{line}\n" for line in lines))
        temporary.replace(self.folder / "hosts")
        self.process.send_signal(signal.SIGHUP)
        time.sleep(0.2)  # dnsmasq reads it from its loop: a query right after may be early

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@contextmanager
def dnsmasq(folder: Path, hosts: Sequence[str], srv: Sequence[str] = ()) -> Iterator[Dnsmasq]:
    """dnsmasq on a free loopback port; `srv`: `--srv-host` values (`_s._tcp.x.test,HOST,PORT`)."""
    binary = dnsmasq_binary()
    (folder / "hosts").write_text("".join(f"{line}\n" for line in hosts))
    port = _free_udp_and_tcp_port()
    args = [
        binary, "--no-daemon", f"--port={port}", "--listen-address=127.0.0.1",
        "--bind-interfaces", "--no-resolv", "--no-hosts", f"--addn-hosts={folder / 'hosts'}",
        "--local=/test/", "--cache-size=0", "--log-facility=-", f"--pid-file={folder / 'pid'}",
        *(f"--srv-host={record}" for record in srv),
        # As root it would drop to `nobody`, who cannot read the test's private folder.
        *(["--user=root"] if os.geteuid() == 0 else []),
    ]  # fmt: skip
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = Dnsmasq(folder, process, port)
    try:
        _wait_listening(port, process)
        yield server
    finally:
        server.stop()


def _wait_listening(port: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            raise RuntimeError(f"dnsmasq exited {process.returncode}: {output}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("dnsmasq did not start listening")
