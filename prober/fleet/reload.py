"""Configuration reload: validate the whole new configuration, then swap it in one step.

A reload (SIGHUP, `POST /-/reload`, or a change of the config file's content seen by the
optional checksum poll, `server.reload_interval_seconds`) reads the file and the environment
as `check-config` does (`load_settings`). A configuration that does not validate, or that
changes what only a restart can change (`restart_needed`), is not applied: the running one
stays, one log line and the answer say why (the line `check-config` prints), and
`llmprober_config_last_reload_successful` reads 0 until a good one loads. A good one is
handed whole to discovery (`Discovery.reconfigure`), the one composer of the set: it merges
the new static targets with the discovered ones of the new `target_groups:` and applies them to
the fleet (`Fleet.apply`), swapping the web config (users, TLS files) at the moment the fleet
commits. Reloads are serialized; one arriving during shutdown is refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from prober import metric_specs as specs
from prober.fleet.compose import Discovery
from prober.fleet.fleet import Applied
from prober.logs import get_logger
from prober.metric_specs import gauge
from prober.settings import ConfigError, Settings, load_settings
from prober.webconfig import LiveWebConfig

log = get_logger("prober.reload")


@dataclass(frozen=True)
class ConfigSource:
    """Where the configuration is read from: the file `run --config` named (None: the
    environment alone) and the environment (None: the process's)."""

    path: Path | None
    environ: Mapping[str, str] | None = None

    def load(self) -> Settings:
        return load_settings(self.path, self.environ)

    def checksum(self, settings: Settings) -> str:
        """A hash of the content of the config file and of its web config file: what a
        ConfigMap update changes, whichever symlink it swapped. An unreadable file hashes
        as missing (the reload that follows says what is wrong)."""
        digest = hashlib.sha256()
        for path in (self.path, settings.server.web_config_file):
            try:
                digest.update(path.read_bytes() if path is not None else b"")
            except OSError:
                digest.update(b"\0missing")
        return digest.hexdigest()


@dataclass(frozen=True)
class Reloaded:
    """A reload's answer: applied or not, and one line saying what or why."""

    ok: bool
    message: str


def restart_needed(old: Settings, new: Settings) -> list[str]:
    """What `new` changes that the running process cannot: each `key (old -> new)`.

    The listening sockets and the event loop are made before the app; the grace is also
    aiohttp's shutdown timeout, fixed when it starts serving; structlog caches its loggers,
    so the logging set-up is made once."""
    changed = []
    pairs = {
        "server.listen": (old.server.listen, new.server.listen),
        "server.event_loop": (old.server.event_loop, new.server.event_loop),
        "server.grace_seconds": (old.server.grace_seconds, new.server.grace_seconds),
        "logging.level": (old.logging.level, new.logging.level),
        "logging.format": (old.logging.format, new.logging.format),
        "logging.log_prompts": (old.logging.log_prompts, new.logging.log_prompts),
    }
    for key, (was, now) in pairs.items():
        if was != now:
            changed.append(f"{key} ({was} -> {now})")
    return changed


class Reloader:
    """Owns the configuration in use and its reloads; see the module docstring."""

    def __init__(
        self,
        source: ConfigSource | None,
        settings: Settings,
        discovery: Discovery,
        web: LiveWebConfig,
        registry: CollectorRegistry,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.settings = settings
        self._discovery = discovery
        self._web = web
        self._wall_clock = wall_clock
        self._successful = gauge(specs.RELOAD_SUCCESSFUL, registry)
        self._success_time = gauge(specs.RELOAD_SUCCESS_TIME, registry)
        self._successful.set(1)
        self._success_time.set(wall_clock())
        self._lock = asyncio.Lock()
        self._poller: asyncio.Task[None] | None = None
        self._triggered: set[asyncio.Task[Reloaded]] = set()
        self._checksum: str | None = None
        self.started = False
        self.last: tuple[float, Reloaded] | None = None  # the last reload: when, and its answer

    async def start(self) -> Applied:
        """The configuration at start applied (discovery's first answers with it); the
        checksum poll started."""
        async with self._lock:
            applied = await self._discovery.start()
            self.started = True
            self._poll(self.settings)
        return applied

    def trigger(self, why: str) -> None:
        """A reload, in the background (SIGHUP)."""
        if not self.started:
            log.info("reload_ignored", trigger=why, note="still starting")
            return
        task = asyncio.create_task(self.reload(why), name=f"reload:{why}")
        self._triggered.add(task)
        task.add_done_callback(self._triggered.discard)

    async def reload(self, why: str) -> Reloaded:
        """Read, validate and apply the configuration; see the module docstring."""
        async with self._lock:
            if self._discovery.closing or not self.started:
                return Reloaded(False, "reload refused: the daemon is shutting down or starting")
            if self.source is None:
                return self._failed(why, "reload refused: no configuration file to read")
            try:
                new = await asyncio.to_thread(self.source.load)
            except ConfigError as exc:
                return self._failed(why, "; ".join(exc.problems))
            self._checksum = await asyncio.to_thread(self.source.checksum, new)
            refusal = restart_needed(self.settings, new)
            if (web := self._web.restart_needed(new.server.web_config)) is not None:
                refusal.append(web)
            if refusal:
                why_not = f"reload refused: {', '.join(refusal)} needs a restart; nothing applied"
                return self._failed(why, why_not)
            try:
                applied = await self._discovery.reconfigure(
                    new, before_commit=lambda: self._web.swap(new.server.web_config)
                )
            except ConfigError as exc:  # a target's key or CA file, read as it is built
                return self._failed(why, "; ".join(exc.problems))
            old, self.settings = self.settings, new
            self._successful.set(1)
            self._success_time.set(self._wall_clock())
            log.info("reload_done", trigger=why, result=applied.summary())
            if old.server.reload_interval_seconds != new.server.reload_interval_seconds:
                self._poll(new)
            done = Reloaded(True, f"reloaded: {applied.summary()}")
            self.last = (self._wall_clock(), done)
            return done

    def _failed(self, why: str, message: str) -> Reloaded:
        self._successful.set(0)
        log.warning("reload_failed", trigger=why, error=message, note="the running config stays")
        failed = Reloaded(False, message)
        self.last = (self._wall_clock(), failed)
        return failed

    def _poll(self, settings: Settings) -> None:
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        interval = settings.server.reload_interval_seconds
        if interval is not None and self.source is not None and self.source.path is not None:
            self._checksum = self.source.checksum(settings)
            self._poller = asyncio.create_task(self._watch(interval), name="reload:poll")

    async def _watch(self, interval: float) -> None:
        """Reload when the content changed since the last reload read it."""
        assert self.source is not None
        while True:
            await asyncio.sleep(interval)
            checksum = await asyncio.to_thread(self.source.checksum, self.settings)
            if checksum != self._checksum:
                self._checksum = checksum
                await self.reload("checksum")

    async def close(self) -> None:
        """No reload from now; one in progress ends first."""
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
        for task in (poller, *self._triggered):
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)
