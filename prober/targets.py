"""A configured target made ready to send, in two parts.

`TargetSpec` is what every request to it is sent with, fixed once built by `target_spec`
(labels, SLO, headers with the API key, TLS, timeouts), a pure function of the config, the
key and the TLS context. `Target` sends: it holds a spec and what sending teaches (the prompt
builder's calibration, warnings logged once). `Target.from_config`, the one way `run`,
`probe` and `bench` build a target, does the I/O the spec needs: the key read (its secrets
registered) and the CA file loaded. `Target.send()` is the one way the daemon, the load
driver and bench send a request: it builds a calibrated prompt, calls
`request.stream_request`, and feeds the server's prompt token count back into the prompt
builder. Every request it sends is opened and closed on the target's `activity`, where each
stream stamps its tokens as they arrive (the engine state reads it).
"""

from __future__ import annotations

import base64
import dataclasses
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import aiohttp

from prober.checks import NO_CHECKS, AnswerChecks, evaluate
from prober.config.secrets import ProxyRoute
from prober.logs import get_logger
from prober.metrics import Labels
from prober.prompts import PromptBuilder, SharedPrefix
from prober.request import RequestSpec, Timeouts, stream_request
from prober.request.activity import StreamActivity
from prober.result import RequestResult
from prober.settings import TargetConfig
from prober.timings import Slo

log = get_logger("prober.targets")


def ssl_context(cfg: TargetConfig) -> ssl.SSLContext | bool:
    """Verification on by default; a per-target CA bundle replaces the system store."""
    if not cfg.url.startswith("https://"):
        return True
    if not cfg.tls.verify:
        return False
    return ssl.create_default_context(cafile=str(cfg.tls.ca_file) if cfg.tls.ca_file else None)


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """What every request to a target is sent with: built once, never changed."""

    config: TargetConfig
    labels: Labels
    slo: Slo
    headers: Mapping[str, str]
    ssl: ssl.SSLContext | bool
    timeouts: Timeouts
    keep_text: bool = False
    checks: AnswerChecks = NO_CHECKS  # judged on every probe's answer (`expect:`)
    # The forward proxy (`proxy:` or the environment's), its credentials; None: direct.
    proxy: str | None = None
    proxy_headers: Mapping[str, str] = field(default_factory=dict)  # Proxy-Authorization


def target_spec(
    cfg: TargetConfig,
    *,
    api_key: str | None,
    tls: ssl.SSLContext | bool,
    keep_text: bool = False,
    proxy: ProxyRoute | None = None,
) -> TargetSpec:
    """The spec of a validated target config, from its inputs alone: no file or environment
    is read and nothing registered (`Target.from_config` reads the key, builds `tls`)."""
    headers = dict(cfg.headers)
    if api_key is not None:
        headers[cfg.api_key_header] = cfg.key_prefix + api_key
    slo = Slo(cfg.slo.ttft_seconds, cfg.slo.tpot_seconds, cfg.slo.e2e_seconds, cfg.slo.ttfo_seconds)
    return TargetSpec(
        config=cfg,
        labels=Labels(cfg.name, cfg.model),
        slo=slo,
        headers=MappingProxyType(headers),
        ssl=tls,
        timeouts=cfg.timeouts.timeouts(),
        keep_text=keep_text,
        checks=cfg.expect.checks() if cfg.expect is not None else NO_CHECKS,
        proxy=proxy.proxy.url if proxy is not None else None,
        proxy_headers=MappingProxyType(proxy_authorization(proxy)),
    )


def proxy_authorization(route: ProxyRoute | None) -> dict[str, str]:
    """The `Proxy-Authorization` header of a route with credentials (basic), else none.
    Its value is the registered "user:password" in base64, which `logs.redact` finds."""
    if route is None or route.auth is None:
        return {}
    token = base64.b64encode(":".join(route.auth).encode()).decode()
    return {"Proxy-Authorization": f"Basic {token}"}


class Target:
    """A target's sender: its spec, and the state sending keeps (the prompt builder's
    calibration, the warnings logged once per target)."""

    def __init__(self, spec: TargetSpec) -> None:
        self.spec = spec
        self.prompts = PromptBuilder(cache_bust=spec.config.cache_bust)
        self.fallback_noted = False  # the first count from events instead of usage was logged
        self.activity = StreamActivity()  # its streams now: open requests, the last token

    @classmethod
    def from_config(cls, cfg: TargetConfig, *, keep_text: bool = False) -> Target:
        """The target `cfg` describes, its spec's I/O done here: the API key (read once, the
        target's secrets registered with it: `TargetConfig.read_secrets`; a config from
        `load_settings` was read there) and the CA file's TLS context. A `FieldError` where
        the key cannot be used."""
        key, tls, proxy = cfg.read_secrets(), ssl_context(cfg), cfg.read_proxy()
        return cls(target_spec(cfg, api_key=key, tls=tls, keep_text=keep_text, proxy=proxy))

    def update(self, spec: TargetSpec) -> None:
        """Send with `spec` from the next request on: a reload that changed none of what makes
        the endpoint (`fleet.changes`), so what sending learned stays."""
        self.spec = spec

    @property
    def config(self) -> TargetConfig:
        return self.spec.config

    @property
    def name(self) -> str:
        return self.spec.config.name

    @property
    def labels(self) -> Labels:
        return self.spec.labels

    @property
    def slo(self) -> Slo:
        return self.spec.slo

    async def send(
        self,
        session: aiohttp.ClientSession,
        t_sched_ns: int,
        *,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
        prompts: PromptBuilder | None = None,
        on_first_token: Callable[[], None] | None = None,
        prefix: SharedPrefix | None = None,
        probe: bool = True,
    ) -> RequestResult:
        """One request scheduled at `t_sched_ns`; the result's outcome says how it went.

        With `prefix` the prompt starts with its shared blocks (a replayed trace). A `probe`
        asks the target's `question` (when set) and has its answer checked (`expect:`);
        background load sends `probe=False`: its prompts are its own lengths."""
        builder = prompts or self.prompts
        tokens = prompt_tokens or self.config.prompt_tokens
        question = self.config.question if probe else None
        checks = self.spec.checks if probe else NO_CHECKS
        words = 0  # a question is not sized, so it teaches the calibration nothing
        if question is not None:
            text = builder.build_question(question)
        elif prefix is None:
            text, words = builder.build(tokens)
        else:
            text, words = builder.build_shared(tokens, prefix)
        spec = RequestSpec(
            base_url=self.config.url,
            api=self.config.api,
            model=self.config.model,
            prompt=text,
            max_tokens=max_tokens or self.config.max_tokens,
            timeouts=self.spec.timeouts,
            headers=self.spec.headers,
            extra_body=self.config.extra_body,
            ssl=self.spec.ssl,
            keep_text=self.spec.keep_text,
            keep_answer=checks.needs_text,
            proxy=self.spec.proxy,
            proxy_headers=self.spec.proxy_headers,
            fresh_connection=self.config.connection == "fresh",
            activity=self.activity,
        )
        key = self.activity.begin(time.perf_counter_ns())
        try:
            result = await stream_request(session, spec, t_sched_ns, on_first_token)
        finally:
            self.activity.end(key)
        if checks.names:
            result = dataclasses.replace(result, checks=evaluate(checks, result))
        if result.token_fallback and not self.fallback_noted:
            self.fallback_noted = True
            log.warning(
                "token_count_from_events",
                target=self.name,
                cause=result.token_fallback,
                lower_bound=result.tokens_lower_bound,
                request_id=result.request_id,
                note="counted in llmprober_token_source_total; logged once per target",
            )
        told = result.prompt_tokens if words else None  # a question's count is not learned
        accepted = not told or builder.observe(words, told)
        if not accepted and builder.rejected == 1:  # noted once, never chased
            log.warning(
                "prompt_tokens_implausible",
                target=self.name,
                words=words,
                prompt_tokens=result.prompt_tokens,
                note="calibration ignores such counts",
            )
        if self.spec.keep_text:  # logging.log_prompts: off by default, prompts can be sensitive
            log.info(
                "request_text",
                target=self.name,
                request_id=result.request_id,
                prompt=text,
                completion=result.text,
            )
        return result
