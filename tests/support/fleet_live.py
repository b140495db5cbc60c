"""The real daemon as a process, for the fleet's live tests: its config file rewritten, its log
read, its `/metrics` parsed; loopback only, everything bounded by a deadline."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.net import free_port, wait_http

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Daemon:
    """`llm-prober run --config PATH`, its output in `log`."""

    def __init__(self, folder: Path, config: dict[str, Any], name: str = "daemon") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = folder / f"{name}.yml"
        self.log = folder / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.write(config)

    def write(self, config: dict[str, Any]) -> None:
        """The config file, written whole (then renamed into place), on this daemon's port."""
        server = {
            "listen": f"127.0.0.1:{self.port}",
            "grace_seconds": 1,
            **config.get("server", {}),
        }
        config = {**config, "server": server}
        self.write_text(yaml.safe_dump(config))

    def write_text(self, text: str) -> None:
        temporary = self.config_path.with_suffix(".new")
        temporary.write_text(text)
        temporary.replace(self.config_path)

    def start(self) -> None:
        cmd = [sys.executable, "-m", "prober.cli", "run", "--config", str(self.config_path)]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        wait_http(f"{self.url}/-/healthy", timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def sighup(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGHUP)

    def samples(self) -> Samples:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        out: Samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def events(self, event: str) -> list[dict[str, Any]]:
        """The JSON log lines of `event`."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == event:
                found.append(record)
        return found


@contextmanager
def running(folder: Path, config: dict[str, Any], name: str = "daemon") -> Iterator[Daemon]:
    daemon = Daemon(folder, config, name)
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.stop()


def targets(samples: Samples, name: str = "llmprober_requests_total") -> set[str]:
    """The `target` label values of the samples named `name`."""
    return {dict(labels)["target"] for sample, labels in samples if sample == name}


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        v
        for (sample, have), v in samples.items()
        if sample == name and all((k, w) in have for k, w in labels.items())
    )


def until(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.25) -> None:
    """Poll `check` until it holds; AssertionError naming `what` at `timeout`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(interval)
