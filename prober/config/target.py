"""A target's configuration: `TargetConfig` and its sections (SLO, timeouts, TLS, traffic).

Every check of a single target is here, each fault a `ValueError` whose text
`prober.validation.describe` passes on. The API key is never a field: `read_secrets` reads it
once (`prober.config.secrets`) and keeps it in a private attribute, so it is never dumped or
printed with the settings.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    Field,
    PrivateAttr,
    StrictInt,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from prober.config.cacheprobe import CacheProbeConfig
from prober.config.expect import ExpectConfig
from prober.config.proxy import ProxyConfig
from prober.config.secrets import ProxyRoute, proxy_route, register_secrets
from prober.config.urls import check_url
from prober.kinds import Api, Connection, Engine
from prober.load.config import LoadConfig
from prober.request import DEFAULT_TIMEOUTS, Timeouts
from prober.section import MAX_SECONDS, PositiveSeconds
from prober.section import Section as _Strict
from prober.validation import CONTROL, bound, field_error, one_line, show, wrong

# A discovered target's default name is `{group}/{address}`: '/' and an IPv6 address's
# brackets are allowed, and a DNS name's length.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/\[\]-]{0,329}")
NAME_SHAPE = "1-330 of letters, digits, '_', '.', ':', '/', '[', ']', '-'"
_MARKS = "!#$%&'*+.^_`|~-"
_HEADER_NAME = re.compile(rf"[0-9A-Za-z{re.escape(_MARKS)}]+")  # RFC 9110's token
_PREFIX = re.compile(r"[\x20-\x7e]*")
MAX_QUESTION_CHARS = 4000
# Keys come only from a variable or a file, where they are read and registered as secrets.
_KEY_SOURCES = "set the API key with api_key_env or api_key_file, not headers"
# Set by the prober itself on every request; a configured one would be sent twice or win.
_RESERVED_HEADERS = frozenset(
    {"x-request-id", "accept-encoding", "content-length", "content-type", "transfer-encoding"}
)


def check_name(value: str) -> None:
    """A target's name: what a label value and `/probe?target=` carry well; else ValueError."""
    if not _NAME.fullmatch(value):
        raise ValueError(wrong(NAME_SHAPE, value))


class SloConfig(_Strict):
    ttft_seconds: PositiveSeconds = 2.0
    tpot_seconds: PositiveSeconds = 0.2
    e2e_seconds: PositiveSeconds | None = None
    ttfo_seconds: PositiveSeconds | None = None  # time to the first answer token


class TimeoutsConfig(_Strict):
    connect_seconds: PositiveSeconds = DEFAULT_TIMEOUTS.connect_seconds
    first_token_seconds: PositiveSeconds = DEFAULT_TIMEOUTS.first_token_seconds
    idle_seconds: PositiveSeconds = DEFAULT_TIMEOUTS.idle_seconds
    total_seconds: PositiveSeconds = DEFAULT_TIMEOUTS.total_seconds

    def timeouts(self) -> Timeouts:
        """What a request is held to (`request.Timeouts`)."""
        return Timeouts(
            self.connect_seconds, self.first_token_seconds, self.idle_seconds, self.total_seconds
        )


class TlsConfig(_Strict):
    verify: bool = True
    ca_file: Path | None = None

    @field_validator("ca_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        if not value.is_file():
            raise ValueError(f"no such file: {show(value)}")
        try:
            ssl.create_default_context(cafile=str(value))
        except (ssl.SSLError, OSError, ValueError) as exc:
            problem = f"{show(value)} holds no PEM certificate ({one_line(exc)})"
            raise ValueError(problem) from None
        return value


class TrafficConfig(_Strict):
    """The mean shape of the engine's other requests, for the queue estimate's drain rate:
    both lengths, since a depth must rest on nothing the operator did not say."""

    prompt_tokens: Annotated[StrictInt, Field(ge=1, le=1_000_000)]
    output_tokens: Annotated[StrictInt, Field(ge=1, le=1_000_000)]

    @field_validator("prompt_tokens", "output_tokens", mode="before")
    @classmethod
    def _from_env(cls, value: Any) -> Any:
        # The environment gives text: accept "512", still refuse "512.5", 512.0 and true.
        return int(value) if isinstance(value, str) and value.strip().isdigit() else value


class SeriesConfig(_Strict):
    """Which optional histogram families a target has: on a large fleet, the two that cost
    the most series per target can be turned off (docs/performance.md, "Fleet scale")."""

    itl: bool = True  # llmprober_itl_seconds, every gap between streamed tokens
    phases: bool = True  # llmprober_probe_phase_seconds, each phase of a probe


class TargetConfig(_Strict):
    name: str
    url: str
    model: str
    api: Api = Api.CHAT
    interval_seconds: Annotated[float, Field(ge=0.1, le=MAX_SECONDS)] = 15.0
    jitter_seconds: Annotated[float, Field(ge=0, le=MAX_SECONDS)] = 1.0
    prompt_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 64
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 16
    warmup: Annotated[int, Field(ge=0, le=100)] = 1
    cache_bust: bool = True
    # What every probe asks, verbatim, after the cache-busting salt line; unset, the
    # synthetic prompt of `prompt_tokens` words (`prompts.PromptBuilder`).
    question: str | None = None
    # What every probe's answer must be (`prober.checks`); a failed check is not good.
    expect: ExpectConfig | None = None
    timeouts: TimeoutsConfig = TimeoutsConfig()
    headers: dict[str, str] = Field(default_factory=dict)
    # Names of `headers` whose values are credentials, redacted like the API key (names in
    # SECRET_HEADER_NAMES always are).
    secret_headers: list[str] = Field(default_factory=list)
    api_key_env: str | None = None
    api_key_file: Path | None = None
    # The header the key goes in, and the text before the key there; None: "Bearer " in
    # Authorization, nothing in any other header (Azure's `api-key: KEY`).
    api_key_header: str = "Authorization"
    api_key_prefix: str | None = None
    slo: SloConfig = SloConfig()
    tls: TlsConfig = TlsConfig()
    # The forward proxy its requests go through: `url`, or HTTPS_PROXY / HTTP_PROXY / NO_PROXY
    # unless `from_env: false` (`config.proxy`).
    proxy: ProxyConfig = ProxyConfig()
    extra_body: dict[str, Any] = Field(default_factory=dict)
    metrics_url: str | None = None
    engine: Engine | None = None
    metrics_interval_seconds: Annotated[float, Field(ge=0.5, le=MAX_SECONDS)] = 5.0
    load: LoadConfig | None = None
    # pooled: keep-alive connections are reused; fresh: every request opens its own (what a
    # new user meets: resolve, connect and TLS in every probe's phases).
    connection: Connection = "pooled"
    # The engine's parallel slots (vLLM --max-num-seqs, llama-server -np, OLLAMA_NUM_PARALLEL):
    # a hint for the queue estimate, which learns them when unset.
    slots: Annotated[StrictInt, Field(ge=1, le=100_000)] | None = None
    # The mean shape of the engine's other requests, or `probes` (they look like the probes):
    # unset, and without the engine's own counters, no waiting depth is estimated.
    traffic: TrafficConfig | Literal["probes"] | None = None
    # Share of probes sent with a companion probe that joins while the first decodes: the
    # first probe's gaps before and after tell the decode slowdown of one more sequence.
    pair_share: Annotated[float, Field(ge=0, le=1)] = 0.5
    # Probes of this target in flight at once; a run due beyond it is skipped and counted.
    probes_in_flight: Annotated[StrictInt, Field(ge=1, le=16)] = 1
    # The optional histogram families this target has (all by default).
    series: SeriesConfig = SeriesConfig()
    # The engine state's window (docs/design.md §12): no token for this long while a request
    # waits is a stall. Unset: `stall_window_seconds`, long enough that a full engine is not
    # called stalled.
    stall_seconds: PositiveSeconds | None = None
    # A prefix sent twice every `interval_seconds`, a miss then a hit: the prefix cache's gain.
    cache_probe: CacheProbeConfig | None = None
    _api_key: str | None = PrivateAttr(default=None)
    _proxy: ProxyRoute | None = PrivateAttr(default=None)
    _secrets_read: bool = PrivateAttr(default=False)

    def read_secrets(self) -> str | None:
        """The API key, read once with the target's secrets registered (`register_secrets`).

        `load_settings` reads them after validation, so `run` sends with the key it checked;
        a target built without a file (bench, probe) is read by `Target.from_config`. A
        `FieldError` names `api_key_env` or `api_key_file` (or a `proxy` field: the proxy
        and its credentials are read with the key, `proxy_route`).
        """
        if not self._secrets_read:
            self._api_key = register_secrets(self)
            self._proxy = proxy_route(self.proxy, self.url)
            self._secrets_read = True
        return self._api_key

    def read_proxy(self) -> ProxyRoute | None:
        """The proxy its requests go through (None: direct), read with the secrets."""
        self.read_secrets()
        return self._proxy

    @property
    def stall_window_seconds(self) -> float:
        """`stall_seconds`, else the first-token timeout plus two intervals: a probe that
        waits in a full engine's queue gets its first token (or times out) within the first,
        and the next probe comes within an interval, its jitter within the second."""
        if self.stall_seconds is not None:
            return self.stall_seconds
        return self.timeouts.first_token_seconds + 2 * self.interval_seconds

    @property
    def key_prefix(self) -> str:
        """What precedes the key in `api_key_header` (`api_key_prefix`, or its default)."""
        if self.api_key_prefix is not None:
            return self.api_key_prefix
        return "Bearer " if self.api_key_header.lower() == "authorization" else ""

    @field_validator("slots", mode="before")
    @classmethod
    def _slots_from_env(cls, value: Any) -> Any:
        # The environment gives text: accept "4", still refuse "4.5", 4.0 and true.
        return int(value) if isinstance(value, str) and value.strip().isdigit() else value

    @field_validator("traffic", mode="wrap")
    @classmethod
    def _traffic(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """One line for a wrong value: pydantic would give one per member of the union (a
        mapping's fault named under `TrafficConfig`, and "should be 'probes'" beside it)."""
        if isinstance(value, dict):
            return TrafficConfig.model_validate(value)  # its faults named under `traffic.`
        if value is None or value == "probes" or isinstance(value, TrafficConfig):
            return handler(value)
        shape = "'probes' or a mapping {prompt_tokens: N, output_tokens: N}"
        raise ValueError(wrong(shape, value, shown=40))

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        check_name(value)
        return value

    @field_validator("url", "metrics_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_url(value)
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not value.strip():
            raise ValueError(wrong("a non-empty string", value))
        return value

    @field_validator("question")
    @classmethod
    def _question(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip() or len(value) > MAX_QUESTION_CHARS:
            raise ValueError(wrong(f"a question of 1-{MAX_QUESTION_CHARS} characters", value))
        if CONTROL.search(value.replace("\n", "")):
            raise ValueError(wrong("text without control characters (line breaks allowed)", value))
        return value

    @model_validator(mode="after")
    def _answer_within_max_tokens(self) -> Self:
        least = self.expect.min_answer_tokens if self.expect is not None else None
        if least is not None and least > self.max_tokens:
            problem = bound("at most", f"max_tokens ({self.max_tokens})", least)
            raise field_error("expect.min_answer_tokens", problem, least)
        return self

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if not _HEADER_NAME.fullmatch(key):
                raise ValueError(f"invalid header name {key!r}")
            if key.lower() == "authorization":  # a credential, whichever header the key is in
                raise ValueError(_KEY_SOURCES)
            if key.lower() in _RESERVED_HEADERS:
                raise ValueError(f"{key} is set by the prober itself")
            if CONTROL.search(text):  # never echo the value: it may be a credential
                raise ValueError(f"value of {key} holds a line break or control character")
        return value

    @field_validator("secret_headers")
    @classmethod
    def _secret_headers(cls, value: list[str], info: ValidationInfo) -> list[str]:
        names = {name.lower() for name in info.data.get("headers", {})}
        for name in value:
            if name.lower() not in names:
                raise ValueError(f"{show(name)} is not one of headers")
        return value

    @field_validator("jitter_seconds")
    @classmethod
    def _jitter(cls, value: float, info: ValidationInfo) -> float:
        interval = info.data.get("interval_seconds")
        if interval is not None and value > interval:
            raise ValueError(bound("at most", f"interval_seconds ({interval:g})", value))
        return value

    @field_validator("api_key_header")
    @classmethod
    def _key_header(cls, value: str) -> str:
        if not _HEADER_NAME.fullmatch(value):
            raise ValueError(wrong(f"a header name (letters, digits and {_MARKS})", value))
        if value.lower() in _RESERVED_HEADERS:
            raise ValueError(f"{value} is set by the prober itself")
        return value

    @field_validator("api_key_prefix")
    @classmethod
    def _key_prefix(cls, value: str | None) -> str | None:
        if value is not None and not _PREFIX.fullmatch(value):
            raise ValueError(wrong("printable ASCII, spaces allowed", value))
        return value

    @model_validator(mode="after")
    def _key_header_is_the_keys(self) -> Self:
        """The key's header is set from the key alone: never also from `headers`, and never
        named without a key to put in it."""
        for name in self.headers:
            if name.lower() == self.api_key_header.lower():
                problem = f"{name} carries the API key (api_key_header): {_KEY_SOURCES}"
                raise field_error("headers", problem, name)
        if self.api_key_env is None and self.api_key_file is None:
            for field in ("api_key_header", "api_key_prefix"):
                if field in self.model_fields_set:
                    problem = "no key to send: set api_key_env or api_key_file too"
                    raise field_error(field, problem, getattr(self, field))
        return self

    @field_validator("api_key_file")
    @classmethod
    def _one_key_source(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("api_key_env"):
            raise ValueError("set api_key_env or api_key_file, not both")
        return value
