"""The daemon's own sections: `server:` (listen address, grace, web config, event loop),
`logging:` and `shard:`."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Annotated, Self

from pydantic import Field, PrivateAttr, field_validator, model_validator

from prober.kinds import EventLoopChoice, LogFormat, LogLevel
from prober.section import MAX_SECONDS
from prober.section import Section as _Strict
from prober.validation import CONTROL, bound, field_error, wrong
from prober.webconfig import WebConfig, load_web_config


class ServerConfig(_Strict):
    listen: str = "0.0.0.0:9470"
    grace_seconds: Annotated[float, Field(gt=0, le=3600)] = 10.0
    web_config_file: Path | None = None  # exporter-toolkit shape: TLS, basic auth
    event_loop: EventLoopChoice = "auto"  # auto: uvloop when installed (prober/runtime.py)
    # Reload when the config file's content changes, checked this often; unset: never (SIGHUP
    # and POST /-/reload still do). Content, not mtime: a ConfigMap swaps a symlink.
    reload_interval_seconds: Annotated[float, Field(ge=1, le=MAX_SECONDS)] | None = None
    _web: WebConfig = PrivateAttr(default_factory=WebConfig)
    _web_read: bool = PrivateAttr(default=False)

    @field_validator("event_loop")
    @classmethod
    def _event_loop(cls, value: EventLoopChoice) -> EventLoopChoice:
        if value == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError("uvloop is not installed (pip install 'llm-prober[fast]')")
        return value

    def read_web_config(self) -> None:
        """Read `web_config_file` once, after validation: the app serves what was read here."""
        if self.web_config_file is not None and not self._web_read:
            self._web = load_web_config(self.web_config_file)  # WebConfigError names the key
        self._web_read = True

    @property
    def web_config(self) -> WebConfig:
        """The validated `web_config_file` (plain HTTP, no auth when unset). Settings made
        without `load_settings` read it here, at first use: a configured file is never
        served as plain HTTP for having been skipped."""
        if not self._web_read:
            self.read_web_config()
        return self._web

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not re.fullmatch(r"[0-9]{1,5}", port) or int(port) > 65535:
            raise ValueError(wrong("HOST:PORT", value))
        if CONTROL.search(host) or " " in host:
            raise ValueError(f"invalid host in {value!r}")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class LoggingConfig(_Strict):
    level: LogLevel = "info"
    format: LogFormat = "auto"
    log_prompts: bool = False


class ShardConfig(_Strict):
    index: Annotated[int, Field(ge=0)] = 0
    count: Annotated[int, Field(ge=1)] = 1

    @model_validator(mode="after")
    def _in_range(self) -> Self:
        if self.index >= self.count:
            problem = bound("less than", f"count ({self.count})", self.index)
            raise field_error("index", problem, self.index)
        return self
