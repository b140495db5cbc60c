"""A configured target made ready to send: labels, SLO, prompts, credentials, TLS.

`Target.send()` is the one way the daemon, the load driver and bench send a request: it
builds a calibrated prompt, calls `request.stream_request`, and feeds the server's prompt
token count back into the prompt builder.
"""

from __future__ import annotations

import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from prober.logs import get_logger, register_secret
from prober.metrics import Labels
from prober.prompts import PromptBuilder
from prober.request import RequestSpec, Timeouts, stream_request
from prober.result import RequestResult
from prober.settings import TargetConfig, resolve_api_key, secret_header_values
from prober.timings import Slo

log = get_logger("prober.targets")


def ssl_context(cfg: TargetConfig) -> ssl.SSLContext | bool:
    """Verification on by default; a per-target CA bundle replaces the system store."""
    if not cfg.url.startswith("https://"):
        return True
    if not cfg.tls.verify:
        return False
    return ssl.create_default_context(cafile=str(cfg.tls.ca_file) if cfg.tls.ca_file else None)


@dataclass
class Target:
    config: TargetConfig
    labels: Labels
    slo: Slo
    headers: dict[str, str]
    ssl: ssl.SSLContext | bool
    timeouts: Timeouts
    keep_text: bool = False
    prompts: PromptBuilder = field(default_factory=PromptBuilder)
    fallback_noted: bool = False  # the first count from events instead of usage was logged

    @classmethod
    def from_config(cls, cfg: TargetConfig, *, keep_text: bool = False) -> Target:
        headers = dict(cfg.headers)
        for value in secret_header_values(cfg):
            register_secret(value)
        if (key := resolve_api_key(cfg)) is not None:
            headers["Authorization"] = f"Bearer {key}"
        t = cfg.timeouts
        return cls(
            config=cfg,
            labels=Labels(cfg.name, cfg.model),
            slo=Slo(
                cfg.slo.ttft_seconds,
                cfg.slo.tpot_seconds,
                cfg.slo.e2e_seconds,
                cfg.slo.ttfo_seconds,
            ),
            headers=headers,
            ssl=ssl_context(cfg),
            timeouts=Timeouts(
                t.connect_seconds, t.first_token_seconds, t.idle_seconds, t.total_seconds
            ),
            keep_text=keep_text,
            prompts=PromptBuilder(cache_bust=cfg.cache_bust),
        )

    @property
    def name(self) -> str:
        return self.config.name

    async def send(
        self,
        session: aiohttp.ClientSession,
        t_sched_ns: int,
        *,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
        prompts: PromptBuilder | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> RequestResult:
        """One request scheduled at `t_sched_ns`; the result's outcome says how it went."""
        builder = prompts or self.prompts
        text, words = builder.build(prompt_tokens or self.config.prompt_tokens)
        spec = RequestSpec(
            base_url=self.config.url,
            api=self.config.api,
            model=self.config.model,
            prompt=text,
            max_tokens=max_tokens or self.config.max_tokens,
            timeouts=self.timeouts,
            headers=self.headers,
            extra_body=self.config.extra_body,
            ssl=self.ssl,
            keep_text=self.keep_text,
            fresh_connection=self.config.connection == "fresh",
        )
        result = await stream_request(session, spec, t_sched_ns, on_first_token)
        if result.token_fallback and not self.fallback_noted:
            self.fallback_noted = True
            log.warning(
                "token_count_from_events", target=self.name, cause=result.token_fallback,
                lower_bound=result.tokens_lower_bound, request_id=result.request_id,
                note="counted in llmprober_token_source_total; logged once per target",
            )  # fmt: skip
        accepted = not result.prompt_tokens or builder.observe(words, result.prompt_tokens)
        if not accepted and builder.rejected == 1:  # noted once, never chased
            log.warning(
                "prompt_tokens_implausible", target=self.name, words=words,
                prompt_tokens=result.prompt_tokens, note="calibration ignores such counts",
            )  # fmt: skip
        if self.keep_text:  # logging.log_prompts: off by default, prompts can be sensitive
            log.info(
                "request_text", target=self.name, request_id=result.request_id, prompt=text,
                completion=result.text,
            )  # fmt: skip
        return result


def spread(rng: random.Random, mean: int, spread_fraction: float) -> int:
    """A uniformly spread integer around `mean` (±spread_fraction), at least 1."""
    if spread_fraction <= 0:
        return mean
    low, high = mean * (1 - spread_fraction), mean * (1 + spread_fraction)
    return max(1, round(rng.uniform(low, high)))
