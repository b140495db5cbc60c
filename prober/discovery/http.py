"""`http_sd`: Prometheus's HTTP SD, a GET answered 200 `application/json` with the file_sd list.

Everything the server sends is hostile until bounded: the body is read to at most
`MAX_BYTES` (more is a fault, not a longer read), asked for and taken without compression (no
decompression runs), parsed off the event loop, and redirects are not followed. Any failure
(a status other than 200, another content type, no JSON, a timeout, no connection) is a fault
and `found=None`: the group keeps its last good list. The TLS context (`tls.ca_file`) is made
off the loop, once; the credential is `HttpSdConfig.authorization`, read and registered when
the configuration loaded, and never logged.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Collection

import aiohttp

from prober import __version__
from prober.config.discovery import HttpSdConfig
from prober.discovery.source import MAX_BYTES, Fault, Fetched, Reason, parse_groups


def _ssl_context(config: HttpSdConfig) -> ssl.SSLContext | bool:
    """Reads the CA file: call it off the loop."""
    if not config.tls.verify:
        return False
    if config.tls.ca_file is None:
        return True
    return ssl.create_default_context(cafile=str(config.tls.ca_file))


class HttpSd:
    """One group's HTTP SD endpoint, polled through a session of its own."""

    def __init__(self, config: HttpSdConfig, declared: Collection[str]) -> None:
        self.config = config
        self.declared = tuple(declared)
        self._session: aiohttp.ClientSession | None = None
        self._ssl: ssl.SSLContext | bool | None = None

    async def fetch(self) -> Fetched:
        url = self.config.url
        try:
            body = await self._get()
        except _Failed as exc:
            return Fetched(None, (exc.fault,))
        except TimeoutError:
            return Fetched(None, (Fault(Reason.TIMEOUT, f"{url}: no answer in time"),))
        except (aiohttp.ClientError, OSError, ssl.SSLError, ValueError) as exc:
            return Fetched(None, (Fault(Reason.CONNECT, f"{url}: {type(exc).__name__}"),))
        try:
            data = await asyncio.to_thread(json.loads, body)
        except (ValueError, UnicodeDecodeError) as exc:
            return Fetched(None, (Fault(Reason.MALFORMED, f"{url}: not JSON ({exc})"),))
        found, faults = parse_groups(data, self.declared, url)
        if any(f.reason is Reason.MALFORMED for f in faults):
            return Fetched(None, tuple(faults))
        return Fetched(tuple(found), tuple(faults))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(self) -> bytes:
        if self._ssl is None:
            self._ssl = await asyncio.to_thread(_ssl_context, self.config)
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.config.timeout_seconds)
            self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        headers = {
            "Accept": "application/json",
            "Accept-Encoding": "identity",
            "User-Agent": f"llm-prober/{__version__}",
        }
        if self.config.authorization is not None:
            headers["Authorization"] = self.config.authorization
        url = self.config.url
        async with self._session.get(
            url, headers=headers, allow_redirects=False, ssl=self._ssl
        ) as response:
            if response.status != 200:
                raise _Failed(Reason.HTTP_STATUS, f"{url}: HTTP {response.status}")
            if response.content_type != "application/json":
                kind = response.content_type[:60]
                raise _Failed(Reason.MALFORMED, f"{url}: content type {kind!r}, not JSON")
            if response.headers.get("Content-Encoding", "identity").lower() != "identity":
                raise _Failed(Reason.MALFORMED, f"{url}: a compressed answer, asked for none")
            body = bytearray()
            while len(body) <= MAX_BYTES and (more := await response.content.read(65536)):
                body += more
            if len(body) > MAX_BYTES:
                raise _Failed(Reason.TOO_LARGE, f"{url}: an answer over {MAX_BYTES} bytes")
            return bytes(body)


class _Failed(Exception):
    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.fault = Fault(reason, detail)
