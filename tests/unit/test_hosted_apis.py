"""Hosted APIs as they are (issue 34, item 1): a base URL's query (Azure OpenAI's
`?api-version=`) stays on every request, behind the joined path; a fragment is refused.

The request goes to a real local server that records the path and query it was sent.
"""

from __future__ import annotations

import time

import pytest
from aiohttp import web

from prober.kinds import Api
from prober.request.send import endpoint
from prober.request.wire import client_session
from prober.settings import ConfigError, Settings, TargetConfig, load_settings
from prober.targets import Target
from tests.support.servers import serve_app
from tests.support.sse import chunk, sse, streaming

AZURE = "https://example.openai.azure.com/openai/deployments/gemma?api-version=2024-06-01"

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/unit/conftest.py


@pytest.mark.parametrize(
    ("base", "api", "url"),
    [
        (AZURE, Api.CHAT,
         "https://example.openai.azure.com/openai/deployments/gemma/chat/completions"
         "?api-version=2024-06-01"),
        (AZURE, Api.COMPLETIONS,
         "https://example.openai.azure.com/openai/deployments/gemma/completions"
         "?api-version=2024-06-01"),
        ("https://h/openai/deployments/gemma/?api-version=2024-06-01&x=a%2Fb", Api.CHAT,
         "https://h/openai/deployments/gemma/chat/completions?api-version=2024-06-01&x=a%2Fb"),
        ("http://h:11434/v1?k=v", Api.OLLAMA, "http://h:11434/api/chat?k=v"),
        ("http://h:8080/v1/", Api.CHAT, "http://h:8080/v1/chat/completions"),
        ("http://h:8080/v1", Api.COMPLETIONS, "http://h:8080/v1/completions"),
        ("http://h:8080/v1?", Api.CHAT, "http://h:8080/v1/chat/completions?"),
    ],
)  # fmt: skip
def test_the_path_is_joined_and_the_query_kept(base: str, api: Api, url: str) -> None:
    assert endpoint(base, api) == url


def test_a_fragment_is_one_line_naming_the_url() -> None:
    url = "https://h/openai/deployments/gemma?api-version=1#top"
    with pytest.raises(ConfigError) as info:
        load_settings(None, {"LLMPROBER_TARGETS__0__NAME": "a",
                             "LLMPROBER_TARGETS__0__URL": url,
                             "LLMPROBER_TARGETS__0__MODEL": "m"})  # fmt: skip
    assert info.value.problems == [
        f"targets[0].url: must be a URL without a fragment ('#...' is never sent), got {url!r}"
    ]


def test_the_azure_url_passes_as_it_is() -> None:
    settings = Settings(targets=[TargetConfig(name="azure", url=AZURE, model="gemma")])
    assert settings.targets[0].url == AZURE


@pytest.mark.parametrize("api", [Api.CHAT, Api.COMPLETIONS])
async def test_the_server_receives_the_joined_path_and_the_query(api: Api) -> None:
    seen: list[str] = []
    answer = streaming([chunk({"content": "hi"}), chunk({}, "stop"), sse("[DONE]")])

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(request.path_qs)
        return await answer(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with serve_app(app) as root:
        base = f"{root}/openai/deployments/gemma?api-version=2024-06-01"
        target = Target.from_config(TargetConfig(name="azure", url=base, model="m", api=api))
        async with client_session() as session:
            result = await target.send(session, time.perf_counter_ns())
    assert result.ok, result.error
    tail = "chat/completions" if api is Api.CHAT else "completions"
    assert seen == [f"/openai/deployments/gemma/{tail}?api-version=2024-06-01"]
