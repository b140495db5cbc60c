"""prober.request.wire says which arrival stamping is live: the protocol's, or the fallback when
aiohttp's private connector factory could not be swapped (another aiohttp)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from prober.logs import setup_logging
from prober.request import wire

INFO = "llmprober_stamping_info"


def reported(session: aiohttp.ClientSession) -> tuple[CollectorRegistry, list[dict[str, Any]]]:
    """`report_stamping`'s registry and the `stamping` log events it wrote."""
    registry = CollectorRegistry()
    logs = io.StringIO()
    setup_logging("json", "info", stream=logs)
    try:
        wire.report_stamping(session, registry)
    finally:
        setup_logging("json", "info")
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if x.startswith("{")]
    return registry, [x for x in lines if x["event"] == "stamping"]


async def test_the_protocol_stamps_arrivals_on_this_aiohttp() -> None:
    async with wire.client_session() as session:
        assert wire.stamping(session) == "protocol"
        registry, events = reported(session)
    assert registry.get_sample_value(INFO, {"method": "protocol"}) == 1
    assert registry.get_sample_value(INFO, {"method": "fallback"}) is None
    assert [(e["level"], e["method"]) for e in events] == [("info", "protocol")]


class ReadOnlyFactory(aiohttp.TCPConnector):
    """A connector whose protocol factory cannot be replaced."""

    @property  # type: ignore[misc]
    def _factory(self) -> Callable[[], Any]:
        return self.__dict__["factory"]  # type: ignore[no-any-return]

    @_factory.setter
    def _factory(self, value: Callable[[], Any]) -> None:
        if "factory" in self.__dict__:
            raise AttributeError("read-only")
        self.__dict__["factory"] = value


def another_protocol(monkeypatch: pytest.MonkeyPatch) -> aiohttp.BaseConnector:
    """An aiohttp whose factory builds some other protocol class than the one wire knows."""
    monkeypatch.setattr(wire, "ResponseHandler", type("OtherHandler", (), {}))
    return aiohttp.TCPConnector()


def read_only(_: pytest.MonkeyPatch) -> aiohttp.BaseConnector:
    return ReadOnlyFactory()


def no_factory(monkeypatch: pytest.MonkeyPatch) -> aiohttp.BaseConnector:
    """An aiohttp where the factory moved: `_factory` is gone from the connector."""
    connector = aiohttp.TCPConnector()
    monkeypatch.delattr(connector, "_factory")
    return connector


@pytest.mark.parametrize("connector", [another_protocol, read_only, no_factory])
async def test_a_failed_swap_is_reported_as_the_fallback(
    monkeypatch: pytest.MonkeyPatch,
    connector: Callable[[pytest.MonkeyPatch], aiohttp.BaseConnector],
) -> None:
    async with wire.request_session(connector(monkeypatch)) as session:
        assert wire.stamping(session) == "fallback"
        registry, events = reported(session)
    assert registry.get_sample_value(INFO, {"method": "fallback"}) == 1
    assert registry.get_sample_value(INFO, {"method": "protocol"}) is None
    assert len(events) == 1
    assert events[0]["level"] == "warning"
    assert events[0]["method"] == "fallback"
    assert events[0]["aiohttp"] == aiohttp.__version__
