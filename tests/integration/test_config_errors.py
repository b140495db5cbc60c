"""Configuration faults that once escaped as tracebacks, or passed `check-config` and then
crashed `run`: each is one line naming the field and exit 2, from both commands, and `run`
fails before it sends a single probe (it binds its port before anything starts).

`check-config` runs in-process; `run` in a subprocess (were it to start, a timeout ends it).
Every URL and listen address is on 127.0.0.1; an unresolvable listen host is one Python's
IDNA codec refuses, so no name server is ever asked.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from prober.cli import main
from tests.support.tls import self_signed_cert

TARGET = {"name": "a", "url": "http://127.0.0.1:1/v1", "model": "m"}
Case = Callable[[Path], dict[str, object]]


def target(**extra: object) -> dict[str, object]:
    return {"targets": [{**TARGET, **extra}]}


def key_file(data: bytes) -> Case:
    def case(folder: Path) -> dict[str, object]:
        (folder / "key").write_bytes(data)
        return target(api_key_file=str(folder / "key"))

    return case


def ca_file(folder: Path) -> dict[str, object]:
    (folder / "ca.pem").write_text("this is not a certificate\n")
    return target(url="https://127.0.0.1:1/v1", tls={"ca_file": str(folder / "ca.pem")})


def encrypted_key(folder: Path) -> dict[str, object]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make an encrypted key")
    cert, key = self_signed_cert(folder)
    locked = folder / "locked.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-out", str(locked), "-aes256", "-passout",
         "pass:secret"], check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    web = folder / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(cert),
                                                         "key_file": str(locked)}}))  # fmt: skip
    return {"server": {"web_config_file": str(web)}, **target()}


CASES: dict[str, tuple[Case, str]] = {
    "binary_key_file": (key_file(b"\x89PNG\r\n\x1a\n\x00\xff"), "targets[0].api_key_file: "),
    "two_line_key_file": (key_file(b"sk-one\nsk-two\n"), "targets[0].api_key_file: "),
    "interval_inf": (lambda _: target(interval_seconds=float("inf")),
                     "targets[0].interval_seconds: "),
    "interval_1e300": (lambda _: target(interval_seconds=1e300, jitter_seconds=0),
                       "targets[0].interval_seconds: "),
    "timeouts_inf": (lambda _: target(timeouts={"total_seconds": float("inf")}),
                     "targets[0].timeouts.total_seconds: "),
    "ca_not_pem": (ca_file, "targets[0].tls.ca_file: "),
    "encrypted_web_key": (encrypted_key, "server.web_config_file: "),
    "url_port_99999": (lambda _: target(url="http://127.0.0.1:99999/v1"), "targets[0].url: "),
    "crlf_header": (lambda _: target(headers={"X-Team": "a\r\nX-Injected: 1"}),
                    "targets[0].headers: "),
    "name_newline": (lambda _: target(name="a\n"), "targets[0].name: "),
    "listen_unresolvable": (lambda _: {"server": {"listen": f"{'a' * 70}.test:9470"}, **target()},
                            "server.listen: "),
}  # fmt: skip


def write(folder: Path, name: str) -> Path:
    document = CASES[name][0](folder)
    path = folder / "config.yml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    return path


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_config_says_one_line_and_exits_2(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, name)
    assert main(["check-config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(CASES[name][1]), lines
    assert "secret" not in lines[0]  # a passphrase or key is never echoed


def run_daemon(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prober.cli", "run", "--config", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    "name", ["binary_key_file", "interval_inf", "encrypted_web_key", "listen_unresolvable"]
)
def test_run_refuses_the_same_with_the_same_line(name: str, tmp_path: Path) -> None:
    path = write(tmp_path, name)
    out = run_daemon(path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(CASES[name][1])


def test_run_on_a_used_port_exits_2_before_any_probe(tmp_path: Path) -> None:
    with socket.socket() as taken, socket.socket() as upstream:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        upstream.bind(("127.0.0.1", 0))
        upstream.listen(8)
        upstream.setblocking(False)
        port, up_port = taken.getsockname()[1], upstream.getsockname()[1]
        doc = {
            "server": {"listen": f"127.0.0.1:{port}"},
            "targets": [{**TARGET, "url": f"http://127.0.0.1:{up_port}/v1", "warmup": 0,
                         "load": {"rate": 50.0}}],
        }  # fmt: skip
        path = tmp_path / "config.yml"
        path.write_text(yaml.safe_dump(doc))
        out = run_daemon(path)
        with pytest.raises(BlockingIOError):
            upstream.accept()  # no probe and no load request ever connected
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        f"server.listen: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
