"""One request to each target before trusting it, and what to fix when it fails.

`diagnosis` words a failed request in one line, the likely cause first: a 404 asks whether
the base URL is the one that ends in /v1, a 401 or 403 names the header the key went in
(never the key), a refused connection names host:port, a certificate that does not verify
suggests `tls.ca_file`. bench's pre-flight and `check-config --probe` both use it, a field
named as the command's user knows it (`names`: a flag for bench). `check_targets` sends
every target one streamed, one-token request with short timeouts, all at once, each on a
session of its own, and returns one line per target.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence

import yarl

from prober.request import Timeouts
from prober.request.send import endpoint
from prober.request.wire import client_session
from prober.result import Outcome, RequestResult
from prober.settings import TargetConfig
from prober.targets import Target

# A pre-flight gives up sooner than a probe: it asks whether the endpoint answers at all.
PREFLIGHT_TIMEOUTS = Timeouts(
    connect_seconds=5.0, first_token_seconds=30.0, idle_seconds=30.0, total_seconds=30.0
)
_PROMPT_TOKENS = 16


def diagnosis(result: RequestResult, cfg: TargetConfig, names: Mapping[str, str] = {}) -> str:
    """What `result`, a failed request to `cfg`, says to fix, in one line; `names` renames
    the fields it mentions (`{"tls.ca_file": "--ca-file"}`)."""

    def name(field: str) -> str:
        return names.get(field, field)

    status, error = result.http_status, result.error or "no detail"
    if status == 404:
        url = endpoint(cfg.url, cfg.api)
        return f"HTTP 404 from {url}: is the base URL the one that ends in /v1?"
    if status in (401, 403):
        if cfg.api_key_env is None and cfg.api_key_file is None:
            keys = f"{name('api_key_env')} or {name('api_key_file')}"
            return f"HTTP {status}: no API key was sent: set {keys}"
        source = (
            f"{name('api_key_env')} {cfg.api_key_env}"
            if cfg.api_key_env
            else f"{name('api_key_file')} {cfg.api_key_file}"
        )
        header = cfg.api_key_header
        return f"HTTP {status}: the key sent in the {header} header was refused ({source})"
    where = _host_port(cfg.url)
    if result.outcome is Outcome.CONNECT_ERROR:
        if "certificate verify failed" in error.lower():
            return f"{where}: TLS certificate not verified: set {name('tls.ca_file')} to its CA"
        return f"cannot connect to {where}: {error}"
    if result.outcome is Outcome.TIMEOUT_CONNECT:
        return f"cannot connect to {where}: {error}"
    return error


def _host_port(url: str) -> str:
    parsed = yarl.URL(url)
    host = f"[{parsed.host}]" if parsed.host and ":" in parsed.host else parsed.host
    return f"{host}:{parsed.port}"


async def check_targets(configs: Sequence[TargetConfig]) -> list[tuple[bool, str]]:
    """(ok, line) per target, in order: `targets[0] (name): ok ...` or what is wrong."""
    return list(await asyncio.gather(*(_check(i, cfg) for i, cfg in enumerate(configs))))


async def _check(index: int, cfg: TargetConfig) -> tuple[bool, str]:
    spec = Target.from_config(cfg).spec
    target = Target(dataclasses.replace(spec, timeouts=_shorter(spec.timeouts)))
    async with client_session() as session:
        result = await target.send(
            session,
            time.perf_counter_ns(),
            prompt_tokens=min(cfg.prompt_tokens, _PROMPT_TOKENS),
            max_tokens=1,
        )
    where = f"targets[{index}] ({cfg.name})"
    if result.ok:
        return True, f"{where}: ok ({cfg.url})"
    return False, f"{where}: {result.outcome.value}: {diagnosis(result, cfg)}"


def _shorter(timeouts: Timeouts) -> Timeouts:
    """Each of the target's timeouts, or the pre-flight's where that is shorter."""
    pairs = zip(dataclasses.astuple(timeouts), dataclasses.astuple(PREFLIGHT_TIMEOUTS), strict=True)
    return Timeouts(*(min(mine, short) for mine, short in pairs))
