"""What a target's URL (`url`, `metrics_url`) may be: http(s), a host, a valid port, no
credentials, no fragment. A query is kept (Azure OpenAI's `?api-version=`): the request's
path is joined before it (`request.send.endpoint`)."""

from __future__ import annotations

import re

import yarl

from prober.validation import wrong


def check_url(value: str) -> None:
    """An http(s) URL with a host, a valid port and no credentials; else ValueError."""
    if not re.match(r"https?://[^/\s]+", value) or not value.isprintable() or " " in value:
        raise ValueError(wrong("an http:// or https:// URL", value))
    try:
        url = yarl.URL(value)
        port = url.port
    except ValueError as exc:
        raise ValueError(f"invalid URL {value!r}: {exc}") from None
    if not url.host or port == 0:
        raise ValueError(f"invalid URL {value!r}: no host or port 0")
    if url.user is not None or url.password is not None:
        raise ValueError("credentials in the URL: use api_key_env, api_key_file or headers")
    if "#" in value:  # a client never sends one: what follows it would be silently lost
        raise ValueError(wrong("a URL without a fragment ('#...' is never sent)", value))
