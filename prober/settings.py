"""Configuration: one validated `Settings`, from a YAML file and `LLMPROBER_*` environment.

The names the rest of the prober imports; the code is in `prober/config/`, one concern a
module (its `__init__` lists them). Environment overrides the file (nested keys with `__`,
e.g. `LLMPROBER_SERVER__LISTEN`; a list item by its index, `LLMPROBER_TARGETS__0__MODEL`).
Unknown keys are errors, in the file and in the environment alike, so a typo never silently
falls back to a default. `load_settings` raises `ConfigError`, whose `problems` are one line
per fault, each naming its field (`targets[0].url: ...`). A target's API key is read once,
after validation, by `TargetConfig.read_secrets` (`prober.config.secrets.register_secrets`,
the one place credentials are registered) and held in a private attribute, never a field.
"""

from __future__ import annotations

from prober.config.discovery import DnsConfig, FileSdConfig, HttpSdConfig, split_address
from prober.config.errors import ConfigError, FieldError
from prober.config.group import TargetGroupConfig
from prober.config.model import Settings, load_settings
from prober.config.secrets import SECRET_HEADER_NAMES, register_secrets, secret_header_values
from prober.config.server import LoggingConfig, ServerConfig, ShardConfig
from prober.config.sources import NOT_SETTINGS, EnvironmentSource, YamlSource, apply_environment
from prober.config.target import SloConfig, TargetConfig, TimeoutsConfig, TlsConfig, TrafficConfig
from prober.config.urls import check_url
from prober.load.config import LoadConfig
from prober.section import MAX_SECONDS
from prober.validation import field_path

__all__ = [
    "MAX_SECONDS",
    "NOT_SETTINGS",
    "SECRET_HEADER_NAMES",
    "ConfigError",
    "DnsConfig",
    "EnvironmentSource",
    "FieldError",
    "FileSdConfig",
    "HttpSdConfig",
    "LoadConfig",
    "LoggingConfig",
    "ServerConfig",
    "Settings",
    "ShardConfig",
    "SloConfig",
    "TargetConfig",
    "TargetGroupConfig",
    "TimeoutsConfig",
    "TlsConfig",
    "TrafficConfig",
    "YamlSource",
    "apply_environment",
    "check_url",
    "field_path",
    "load_settings",
    "register_secrets",
    "secret_header_values",
    "split_address",
]
