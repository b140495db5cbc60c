"""A target group (`target_groups:`): one discovery source and the template of its targets.

`TargetGroupConfig` holds every setting a target has (it is `TargetConfig`'s fields: model,
api, slo, slots, traffic, load, timeouts, headers, api_key_env...), with templates in place
of `name`, `url` and `metrics_url`, beside the group's own keys: `group`, exactly one source
(`file_sd`, `http_sd` or `dns`, `prober.config.discovery`), `labels` (the discovery labels
that reach `llmprober_target_info`), `remove_after_seconds` and `gateway` (the static target
in front of the group's replicas, its router; `Settings` checks that it names one). A
template's placeholders are `{group}`, `{address}` (`host:port` as the source gave it),
`{host}` and `{port}`; each
template is checked when the configuration loads by expanding it for a sample address, so a
group that loads makes valid targets of every valid address. `target(address)` makes one: a
`TargetConfig` validated as a static target is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Self

from pydantic import Field, field_validator, model_validator

from prober.config.discovery import DnsConfig, FileSdConfig, HttpSdConfig, split_address
from prober.config.errors import FieldError
from prober.config.target import TargetConfig, check_name
from prober.config.urls import check_url
from prober.section import MAX_SECONDS
from prober.validation import field_error, one_of, wrong

PLACEHOLDERS = ("group", "address", "host", "port")
DEFAULT_NAME = "{group}/{address}"
DEFAULT_URL = "http://{address}/v1"
# What a template is shown expanded with, where the expansion is at fault.
SAMPLE_ADDRESS = "127.0.0.1:8000"
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
# A Prometheus label name, not one of the prober's own (`__` names are Prometheus's).
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
RESERVED_LABELS = frozenset(
    {"target", "group", "address", "gateway", "model", "mode", "job", "instance"}
)
_TEMPLATES = ("name", "url", "metrics_url")
_SOURCES = ("file_sd", "http_sd", "dns")


def expand(template: str, values: Mapping[str, str]) -> str:
    """`template` with each `{placeholder}` replaced by its value (checked beforehand)."""
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def check_template(template: str) -> None:
    """Only known placeholders, and no brace outside one; else ValueError."""
    for name in _PLACEHOLDER.findall(template):
        if name not in PLACEHOLDERS:
            raise ValueError(f"unknown placeholder {{{name}}}: {one_of(PLACEHOLDERS, name)}")
    if "{" in _PLACEHOLDER.sub("", template) or "}" in _PLACEHOLDER.sub("", template):
        raise ValueError(wrong("a template with balanced {placeholders}", template))


class TargetGroupConfig(TargetConfig):
    """A target's settings with templates for `name`, `url` and `metrics_url`, and the group's
    own keys. It is never a target itself: `target(address)` makes one."""

    name: str = DEFAULT_NAME
    url: str = DEFAULT_URL
    group: str
    file_sd: FileSdConfig | None = None
    http_sd: HttpSdConfig | None = None
    dns: DnsConfig | None = None
    labels: Annotated[list[str], Field(max_length=32)] = Field(default_factory=list)
    remove_after_seconds: Annotated[float, Field(ge=0, le=MAX_SECONDS)] = 60.0
    # The static target that routes to this group's replicas: its info series carries
    # `group` and `gateway="true"`, so its TTFT is read beside theirs (the router's share).
    gateway: str | None = None

    # These two replace TargetConfig's checks of the same names: here they are templates.
    @field_validator("url", "metrics_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_template(value)
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        check_template(value)
        return value

    @field_validator("group")
    @classmethod
    def _group(cls, value: str) -> str:
        if not _GROUP.fullmatch(value):
            raise ValueError(wrong("1-64 of letters, digits, '_', '.', ':', '-'", value))
        return value

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, value: str | None) -> str | None:
        if value is not None:
            check_name(value)
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _LABEL.fullmatch(name) or name.startswith("__"):
                shape = "a label name (letters, digits, '_'; not starting with '__')"
                raise ValueError(wrong(shape, name, shown=80))
            if name in RESERVED_LABELS:
                raise ValueError(f"{name} is a label of the prober's own series")
        if len(set(value)) != len(value):
            raise ValueError("label names must be unique")
        return value

    @model_validator(mode="after")
    def _one_source_and_templates(self) -> Self:
        given = [source for source in _SOURCES if getattr(self, source) is not None]
        if len(given) != 1:
            got = ", ".join(given) or "none"
            raise ValueError(f"set exactly one source of file_sd, http_sd and dns, got {got}")
        values = self._values(SAMPLE_ADDRESS)
        for field in _TEMPLATES:
            template = getattr(self, field)
            if template is None:
                continue
            text = expand(template, values)
            try:
                if field == "name":
                    check_name(text)
                else:
                    check_url(text)
            except ValueError as exc:
                problem = f"for address {SAMPLE_ADDRESS} it gives {text!r}: {exc}"
                raise field_error(field, problem, template) from None
        return self

    def read_secrets(self) -> str | None:
        """The targets' API key (as `TargetConfig.read_secrets`), and `http_sd`'s credential
        read and registered; a `FieldError` names the field (`http_sd.bearer_token_env`)."""
        if self.http_sd is not None:
            try:
                self.http_sd.read_secrets()
            except FieldError as exc:
                raise FieldError(f"http_sd.{exc.field}", exc.message) from None
        return super().read_secrets()

    @property
    def refresh_interval_seconds(self) -> float:
        """The source's own refresh interval."""
        source = self.file_sd or self.http_sd or self.dns
        assert source is not None  # exactly one, validated
        return source.refresh_interval_seconds

    def name_for(self, address: str) -> str:
        """The name the target of `address` gets (the `name` template alone, nothing built:
        what the shard is decided on); ValueError for an address that is no `host:port`."""
        return expand(self.name, self._values(address))

    def target(self, address: str) -> TargetConfig:
        """The target of one discovered `host:port`, validated as a static target is;
        ValueError for an address that is no `host:port`, pydantic's ValidationError for a
        target that is invalid with it."""
        values = self._values(address)
        data: dict[str, Any] = {
            field: getattr(self, field)
            for field in self.model_fields_set
            if field in TargetConfig.model_fields and field not in _TEMPLATES
        }
        data["name"] = expand(self.name, values)
        data["url"] = expand(self.url, values)
        if self.metrics_url is not None:
            data["metrics_url"] = expand(self.metrics_url, values)
        return TargetConfig.model_validate(data)

    def _values(self, address: str) -> dict[str, str]:
        host, port = split_address(address)
        return {"group": self.group, "address": address, "host": host, "port": port}
