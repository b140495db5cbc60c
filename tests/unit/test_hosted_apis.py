"""Hosted APIs as they are (issue 34, item 1): a base URL's query (Azure OpenAI's
`?api-version=`) stays on every request, behind the joined path; a fragment is refused.

The request goes to a real local server that records the path and query it was sent.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
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


# -- the key in any header ---------------------------------------------------------------

KEY = "sk-hosted-0123456789abcdef"
VARIABLE = "LLMPROBER_TEST_HOSTED_KEY"


def keyed(**fields: object) -> TargetConfig:
    return TargetConfig.model_validate(
        {"name": "a", "url": "http://127.0.0.1:1/v1", "model": "m", "api_key_env": VARIABLE,
         **fields}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "headers"),
    [
        ({}, {"Authorization": f"Bearer {KEY}"}),
        ({"api_key_header": "api-key"}, {"api-key": KEY}),
        ({"api_key_header": "authorization"}, {"authorization": f"Bearer {KEY}"}),
        ({"api_key_header": "X-Goog-Api-Key", "api_key_prefix": "Key "},
         {"X-Goog-Api-Key": f"Key {KEY}"}),
        ({"api_key_prefix": ""}, {"Authorization": KEY}),
        ({"api_key_header": "api-key", "headers": {"X-Team": "search"}},
         {"X-Team": "search", "api-key": KEY}),
    ],
)  # fmt: skip
def test_the_key_goes_in_its_header_alone(
    fields: dict[str, object], headers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, KEY)
    assert dict(Target.from_config(keyed(**fields)).spec.headers) == headers


def test_without_a_key_no_key_header_is_sent() -> None:
    cfg = TargetConfig(name="a", url="http://127.0.0.1:1/v1", model="m")
    assert dict(Target.from_config(cfg).spec.headers) == {}


BAD_KEY_HEADERS = [
    ({"api_key_header": "api key"},
     "targets[0].api_key_header: must be a header name (letters, digits and "
     "!#$%&'*+.^_`|~-), got 'api key'"),
    ({"api_key_header": "X-Request-Id"},
     "targets[0].api_key_header: X-Request-Id is set by the prober itself"),
    ({"api_key_prefix": "Bearer\r\n"},
     "targets[0].api_key_prefix: must be printable ASCII, spaces allowed, got 'Bearer\\r\\n'"),
    ({"api_key_header": "api-key", "headers": {"API-Key": "x"}},
     "targets[0].headers: API-Key carries the API key (api_key_header): set the API key with "
     "api_key_env or api_key_file, not headers"),
    ({"api_key_header": "api-key", "headers": {"Authorization": "Bearer x"}},
     "targets[0].headers: set the API key with api_key_env or api_key_file, not headers"),
    ({"api_key_env": None, "api_key_header": "api-key"},
     "targets[0].api_key_header: no key to send: set api_key_env or api_key_file too"),
    ({"api_key_env": None, "api_key_prefix": "Key "},
     "targets[0].api_key_prefix: no key to send: set api_key_env or api_key_file too"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "problem"), BAD_KEY_HEADERS)
def test_a_bad_key_header_is_one_line_naming_the_field(
    fields: dict[str, object], problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, KEY)
    target = {"name": "a", "url": "http://127.0.0.1:1/v1", "model": "m", "api_key_env": VARIABLE}
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump({"targets": [{**target, **fields}]}))
    with pytest.raises(ConfigError) as info:
        load_settings(path, {})
    assert info.value.problems == [problem]


async def test_the_server_gets_the_key_in_its_header_and_never_echoes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Azure's shape: `api-key: KEY` and no Authorization; a 401 body quoting the header is
    redacted from the result's error like any registered key."""
    seen: list[dict[str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        await request.read()
        return web.json_response({"error": f"bad key {request.headers['api-key']}"}, status=401)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    monkeypatch.setenv(VARIABLE, KEY)
    async with serve_app(app) as root:
        cfg = keyed(url=f"{root}/openai/deployments/gemma?api-version=2024-06-01",
                    api_key_header="api-key")  # fmt: skip
        async with client_session() as session:
            result = await Target.from_config(cfg).send(session, time.perf_counter_ns())
    assert seen[0]["api-key"] == KEY
    assert "Authorization" not in seen[0]
    assert result.http_status == 401
    assert result.error is not None
    assert "bad key" in result.error
    assert KEY not in result.error
    assert KEY[:12] not in result.error
