"""Discovery without a source: `target_groups:` faults (one line naming the field), template
expansion, the target-group list's labels and addresses, removal after `remove_after_seconds`,
name clashes, and the runner's desired set, debounce and series against a scripted source."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from prober.config.group import TargetGroupConfig
from prober.discovery import Discovered, Fault, Fetched, Reason
from prober.discovery.source import MAX_LABEL_CHARS, MAX_TARGETS, parse_groups
from prober.discovery.state import GroupState, merge
from prober.fleet.compose import Discovery
from prober.fleet.fleet import Applied
from prober.settings import ConfigError, Settings, TargetConfig, load_settings
from tests.support.fleets import Recording

STATIC = {"name": "local", "url": "http://127.0.0.1:1/v1", "model": "m"}


def group() -> dict[str, Any]:
    return {"group": "g", "model": "m", "dns": {"name": "llm.test", "type": "A", "port": 8000}}


def problems(tmp_path: Path, document: dict[str, Any], env: Mapping[str, str] = {}) -> list[str]:
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(document))
    try:
        load_settings(path, env)
    except ConfigError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"dns": {"name": "a.test", "type": "A"}},
         "target_groups[0].dns.port: required with type A (its records hold no port)"),
        ({"dns": {"name": "a.test", "type": "SRV", "port": 80}},
         "target_groups[0].dns.port: SRV records carry their own port: set it for type A or "
         "AAAA only"),
        ({"dns": {"name": "a.test", "type": "A", "port": 0}},
         "target_groups[0].dns.port: must be at least 1, got 0"),
        ({"dns": {"name": "a.test", "type": "MX", "port": 1}},
         "target_groups[0].dns.type: must be one of 'A', 'AAAA' or 'SRV', got 'MX'"),
        ({"dns": {"name": "a b", "type": "SRV"}},
         "target_groups[0].dns.name: must be a DNS name, got 'a b'"),
        ({"dns": {"name": "a.test", "server": "dns.example:53"}},
         "target_groups[0].dns.server: must be an IP address, with :port or without (53), "
         "got 'dns.example:53'"),
        ({"dns": None, "file_sd": {"files": []}},
         "target_groups[0].file_sd.files: List should have at least 1 item after validation,"
         " not 0"),
        ({"dns": None},
         "target_groups[0]: set exactly one source of file_sd, http_sd and dns, got none"),
        ({"http_sd": {"url": "http://127.0.0.1:1/sd"}},
         "target_groups[0]: set exactly one source of file_sd, http_sd and dns, got http_sd, "
         "dns"),
        ({"dns": None, "http_sd": {"url": "ftp://x/sd"}},
         "target_groups[0].http_sd.url: must be an http:// or https:// URL, got 'ftp://x/sd'"),
        ({"dns": None, "http_sd": {"url": "http://x/sd", "basic_auth": {"username": "u"}}},
         "target_groups[0].http_sd.basic_auth.password_env: set one of password_env and "
         "password_file"),
        ({"url": "ftp://{address}/v1"},
         "target_groups[0].url: for address 127.0.0.1:8000 it gives 'ftp://127.0.0.1:8000/v1':"
         " must be an http:// or https:// URL, got 'ftp://127.0.0.1:8000/v1'"),
        ({"metrics_url": "http://{adress}/metrics"},
         "target_groups[0].metrics_url: unknown placeholder {adress}: must be one of 'group', "
         "'address', 'host' or 'port', got 'adress'"),
        ({"name": "{group}/{address"},
         "target_groups[0].name: must be a template with balanced {placeholders}, got "
         "'{group}/{address'"),
        ({"labels": ["zone", "target"]},
         "target_groups[0].labels: target is a label of the prober's own series"),
        ({"labels": ["__meta_x"]},
         "target_groups[0].labels: must be a label name (letters, digits, '_'; not starting "
         "with '__'), got '__meta_x'"),
        ({"remove_after_seconds": -1},
         "target_groups[0].remove_after_seconds: must be at least 0, got -1"),
        ({"group": "a/b"},
         "target_groups[0].group: must be 1-64 of letters, digits, '_', '.', ':', '-', got "
         "'a/b'"),
        ({"slo": {"ttft_secnds": 1}},
         "target_groups[0].slo.ttft_secnds: unknown key, did you mean ttft_seconds?"),
        ({"slots": 0}, "target_groups[0].slots: must be at least 1, got 0"),
        ({"modle": "x"}, "target_groups[0].modle: unknown key, did you mean model?"),
        ({"api_key_env": "LLMPROBER_TEST_SURELY_UNSET"},
         "target_groups[0].api_key_env: environment variable LLMPROBER_TEST_SURELY_UNSET is "
         "unset"),
        ({"dns": None, "http_sd": {"url": "http://x/sd", "bearer_token_file": "/nonexistent"}},
         "target_groups[0].http_sd.bearer_token_file: cannot read /nonexistent: No such file "
         "or directory"),
    ],
)  # fmt: skip
def test_a_bad_group_is_one_line_naming_the_field(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    entry = {**group(), **change}
    entry = {key: value for key, value in entry.items() if value is not None}
    assert problems(tmp_path, {"target_groups": [entry]}) == [expected]


def test_groups_are_unique_and_a_group_alone_is_enough(tmp_path: Path) -> None:
    twice = {"target_groups": [group(), group()]}
    assert problems(tmp_path, twice) == ["target_groups: group names must be unique, repeated: g"]
    assert problems(tmp_path, {"target_groups": [group()]}) == []
    assert problems(tmp_path, {}) == [
        "targets: at least one target is required (or a target_groups entry)"
    ]


def test_a_group_from_the_environment(tmp_path: Path) -> None:
    env = {
        "LLMPROBER_TARGET_GROUPS__0__GROUP": "vllm",
        "LLMPROBER_TARGET_GROUPS__0__MODEL": "m",
        "LLMPROBER_TARGET_GROUPS__0__DNS__NAME": "vllm.test",
        "LLMPROBER_TARGET_GROUPS__0__DNS__TYPE": "A",
        "LLMPROBER_TARGET_GROUPS__0__DNS__PORT": "8000",
        "LLMPROBER_TARGET_GROUPS__0__SLO__TTFT_SECONDS": "1.5",
        "LLMPROBER_TARGET_GROUPS__0__HTTP_SD__BEARER_TOKEN_ENV": "LLMPROBER_SD_TOKEN",
    }
    assert problems(tmp_path, {}, env) == ["target_groups[0].http_sd.url: required"]
    del env["LLMPROBER_TARGET_GROUPS__0__HTTP_SD__BEARER_TOKEN_ENV"]
    settings = load_settings(None, env)
    [loaded] = settings.target_groups
    assert loaded.dns is not None
    assert loaded.dns.port == 8000
    assert loaded.target("127.0.0.1:8000").slo.ttft_seconds == 1.5


def test_templates_expand_every_setting_passes() -> None:
    config = TargetGroupConfig.model_validate(
        {
            **group(),
            "url": "https://{host}:{port}/v1",
            "metrics_url": "http://{host}:9090/metrics?port={port}",
            "name": "{group}-{port}",
            "slots": 8,
            "traffic": "probes",
            "headers": {"X-Team": "a"},
            "timeouts": {"connect_seconds": 1.0},
        }
    )
    target = config.target("[::1]:8000")
    assert (target.name, target.url, target.metrics_url) == (
        "g-8000",
        "https://[::1]:8000/v1",
        "http://[::1]:9090/metrics?port=8000",
    )
    assert (target.slots, target.traffic, target.headers) == (8, "probes", {"X-Team": "a"})
    assert target.timeouts.connect_seconds == 1.0
    default = TargetGroupConfig.model_validate(group())
    made = default.target("10.0.0.7:8000")
    assert (made.name, made.url) == ("g/10.0.0.7:8000", "http://10.0.0.7:8000/v1")
    for bad in ("10.0.0.7", "[::1:8000", "a b:80", "h:0", "h:65536", "h:80/x", "::1:80"):
        with pytest.raises(ValueError, match="host:port"):
            default.target(bad)


def test_the_list_keeps_declared_labels_bounded_and_checks_addresses() -> None:
    data = [
        {"targets": ["127.0.0.1:8000", "[::1]:8001", "bad address", 7],
         "labels": {"zone": "a" * 500 + "\n", "secret": "x", "__meta_y": "z"}},
        {"targets": ["127.0.0.1:8000", "127.0.0.1:8002"], "labels": {"zone": "b"}},
    ]  # fmt: skip
    found, faults = parse_groups(data, ["zone"], "f.json")
    assert [d.address for d in found] == ["127.0.0.1:8000", "[::1]:8001", "127.0.0.1:8002"]
    assert found[0].labels == (("zone", "a" * MAX_LABEL_CHARS),)  # the first entry's labels
    assert found[2].labels == (("zone", "b"),)
    assert [f.reason for f in faults] == [Reason.INVALID_TARGET]
    _, faults = parse_groups({"targets": []}, [], "x")
    assert [f.reason for f in faults] == [Reason.MALFORMED]
    _, faults = parse_groups([{"targets": ["127.0.0.1:1"], "labels": {"zone": 1}}], ["zone"], "x")
    assert [f.reason for f in faults] == [Reason.MALFORMED]
    many = [{"targets": [f"127.0.0.1:{p}" for p in range(1, MAX_TARGETS + 10)]}]
    found, faults = parse_groups(many, [], "x")
    assert len(found) == MAX_TARGETS
    assert [f.reason for f in faults] == [Reason.TOO_MANY]


def test_an_absent_address_leaves_after_remove_after_seconds() -> None:
    state = GroupState(TargetGroupConfig.model_validate({**group(), "remove_after_seconds": 60}))
    a, b = Discovered("127.0.0.1:8000"), Discovered("127.0.0.1:8001")
    state.update([a, b], now=0)
    first = state.members()
    state.update([a], now=30)
    assert state.addresses == ["127.0.0.1:8000", "127.0.0.1:8001"]
    state.update([a], now=89)  # absent since 30: 59 s
    assert len(state.members()) == 2
    state.update([a, b], now=95)  # back: its absence is forgotten
    state.update([a], now=100)
    state.update([a], now=159)
    assert len(state.members()) == 2
    state.update([a], now=160)
    assert state.addresses == ["127.0.0.1:8000"]
    assert state.members()[0].config is first[0].config  # unchanged: the same configuration


def test_a_target_the_template_refuses_is_left_out_once() -> None:
    config = TargetGroupConfig.model_validate({**group(), "name": "{group}-{host}"})
    state = GroupState(config)
    state.update([Discovered("127.0.0.1:8000"), Discovered("a_b:8000")], now=0)
    assert [m.address for m in state.members()] == ["127.0.0.1:8000", "a_b:8000"]
    long_host = "h" * 60 + "." + "i" * 60 + "." + "j" * 60 + "." + "k" * 60 + "." + "l" * 10
    state.update([Discovered(f"{long_host}:8000"), Discovered("127.0.0.1:8000")], now=1)
    assert [m.address for m in state.members()] == ["127.0.0.1:8000", "a_b:8000"]


def test_name_clashes_keep_the_first_owner() -> None:
    static = [TargetConfig.model_validate({**STATIC, "name": "g/127.0.0.1:8000"})]
    one = GroupState(TargetGroupConfig.model_validate(group()))
    one.update([Discovered("127.0.0.1:8000"), Discovered("127.0.0.1:8001")], now=0)
    other = TargetGroupConfig.model_validate({**group(), "group": "h", "name": "g/{address}"})
    two = GroupState(other)
    two.update([Discovered("127.0.0.1:8001"), Discovered("127.0.0.1:8002")], now=0)
    same = TargetGroupConfig.model_validate({**group(), "group": "k", "name": "{group}"})
    three = GroupState(same)
    three.update([Discovered("127.0.0.1:1"), Discovered("127.0.0.1:2")], now=0)
    desired, members, clashes = merge(static, [one.members(), two.members(), three.members()])
    assert list(desired) == ["g/127.0.0.1:8000", "g/127.0.0.1:8001", "g/127.0.0.1:8002", "k"]
    assert desired["g/127.0.0.1:8000"] is static[0]
    assert members["g/127.0.0.1:8001"].group == "g"
    assert members["k"].address == "127.0.0.1:1"
    assert [c.line() for c in clashes] == [
        "target name g/127.0.0.1:8000 of group g (address 127.0.0.1:8000) is taken by a "
        "static target: skipped",
        "target name g/127.0.0.1:8001 of group h (address 127.0.0.1:8001) is taken by group g:"
        " skipped",
        "target name k of group k (address 127.0.0.1:2) is taken by group k: skipped",
    ]


def settings_of(*groups: dict[str, Any], static: bool = True, **more: Any) -> Settings:
    """Settings of `STATIC` (unless `static=False`) and `groups`; `more` over them."""
    document = {"targets": [STATIC] if static else [], "target_groups": list(groups), **more}
    return Settings.model_validate(document)


class Scripted:
    """A source that answers what the test queued, then its last answer again."""

    def __init__(self, *answers: Fetched) -> None:
        self.answers = list(answers)
        self.closed = False

    async def fetch(self) -> Fetched:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    async def close(self) -> None:
        self.closed = True


def found(*ports: int, zone: str = "a") -> Fetched:
    return Fetched(tuple(Discovered(f"127.0.0.1:{p}", (("zone", zone),)) for p in ports))


async def test_the_runner_hands_over_changes_debounced_and_exports_its_series() -> None:
    config = {**group(), "labels": ["zone"], "remove_after_seconds": 0}
    failed = Fetched(None, (Fault(Reason.TIMEOUT, "no answer"),))
    source = Scripted(found(8000), failed, found(8000, 8001), found(8001))
    fleet = Recording()
    applied = fleet.applied
    now = [0.0]
    discovery = Discovery(
        settings_of(config), fleet,
        sources=lambda _: source, clock=lambda: now[0], wall=lambda: 1000 + now[0],
        debounce_seconds=0.05,
    )  # fmt: skip
    registry = CollectorRegistry()
    registry.register(discovery)
    await discovery.start()
    await discovery.stop()  # the loops: refreshed by hand below
    assert applied == [["g/127.0.0.1:8000", "local"]]
    group_state = discovery._groups[0]
    now[0] = 10
    await discovery.refresh(group_state)  # fails: the last good list is kept
    await discovery.refresh(group_state)  # adds 8001
    await discovery.refresh(group_state)  # removes 8000 (remove_after_seconds: 0)
    await asyncio.sleep(0.2)
    assert applied == [["g/127.0.0.1:8000", "local"], ["g/127.0.0.1:8001", "local"]]
    assert fleet.whole == [["g/127.0.0.1:8000"], ["g/127.0.0.1:8001"]]  # its load whole here
    sample = registry.get_sample_value
    info = {"target": "g/127.0.0.1:8001", "group": "g", "address": "127.0.0.1:8001"}
    assert sample("llmprober_target_info", {**info, "zone": "a"}) == 1
    assert sample("llmprober_target_info", {**STATIC_INFO}) == 1
    assert sample("llmprober_discovery_targets", {"group": "g"}) == 1
    assert sample("llmprober_discovery_errors_total", {"group": "g", "reason": "timeout"}) == 1
    assert sample("llmprober_discovery_errors_total", {"group": "g", "reason": "dns"}) == 0
    assert sample("llmprober_discovery_last_refresh_timestamp_seconds", {"group": "g"}) == 1010
    assert source.closed


STATIC_INFO = {"target": "local", "group": "", "address": "127.0.0.1:1"}


def test_a_gateway_names_one_static_target_of_one_group(tmp_path: Path) -> None:
    other = {**group(), "group": "h", "gateway": "local"}
    assert problems(
        tmp_path, {"targets": [STATIC], "target_groups": [{**group(), "gateway": "nope"}]}
    ) == [
        "target_groups[0].gateway: names no target of targets: (a gateway is a static target):"
        " 'nope'"
    ]
    twice = {"targets": [STATIC], "target_groups": [{**group(), "gateway": "local"}, other]}
    assert problems(tmp_path, twice) == [
        "target_groups[1].gateway: 'local' is already the gateway of group 'g'"
    ]
    assert problems(tmp_path, {**twice, "target_groups": [other]}) == []
    labels = {**group(), "labels": ["gateway"]}
    assert problems(tmp_path, {"target_groups": [labels]}) == [
        "target_groups[0].labels: gateway is a label of the prober's own series"
    ]


async def test_a_gateway_s_info_series_names_its_group() -> None:
    config = {**group(), "gateway": "local"}
    discovery = Discovery(
        settings_of(config), Recording(), sources=lambda _: Scripted(found(8000, zone="a"))
    )
    registry = CollectorRegistry()
    registry.register(discovery)
    await discovery.start()
    await discovery.stop()
    sample = registry.get_sample_value
    assert sample("llmprober_target_info", {**STATIC_INFO, "group": "g", "gateway": "true"}) == 1
    replica = {"target": "g/127.0.0.1:8000", "group": "g", "address": "127.0.0.1:8000", "zone": "a"}
    assert sample("llmprober_target_info", replica) == 1


async def test_a_source_down_at_start_starts_without_it() -> None:
    source = Scripted(Fetched(None, (Fault(Reason.DNS, "llm.test: SERVFAIL"),)))
    fleet = Recording()
    discovery = Discovery(settings_of(group()), fleet, sources=lambda _: source)
    await discovery.start()
    await discovery.stop()
    assert fleet.applied == [["local"]]
    assert sorted(discovery.desired_set()) == ["local"]
    assert Settings.model_validate({"target_groups": [group()]}).targets == []


async def test_a_reload_is_composed_with_the_discovered_targets() -> None:
    """The reloader hands discovery the new settings: static ∪ discovered is applied, a changed
    source keeps the group's last good list until it answers, a removed group's targets leave,
    and a reload the fleet refuses changes nothing."""
    made: list[Scripted] = []
    answers = [found(8000), Fetched(None, (Fault(Reason.DNS, "SERVFAIL"),)), found(8001)]

    def source(_: TargetGroupConfig) -> Scripted:
        made.append(Scripted(answers.pop(0)))
        return made[-1]

    fleet = Recording()
    other = {**STATIC, "name": "other"}
    discovery = Discovery(settings_of(group()), fleet, sources=source, debounce_seconds=60)
    await discovery.start()
    try:
        await discovery.reconfigure(settings_of(group(), targets=[STATIC, other], static=False))
        moved = {**group(), "dns": {"name": "moved.test", "type": "A", "port": 8000}}
        await discovery.reconfigure(settings_of(moved, targets=[STATIC, other], static=False))
        assert made[0].closed
        assert not made[1].closed
        kept = ["g/127.0.0.1:8000", "local", "other"]
        assert fleet.applied == [["g/127.0.0.1:8000", "local"], kept, kept]

        async def refuse(*_: Any, **__: Any) -> Applied:
            raise ConfigError(["targets[1].tls.ca_file: cannot read it"])

        fleet.apply = refuse  # type: ignore[method-assign]
        with pytest.raises(ConfigError):
            await discovery.reconfigure(settings_of(moved, {**group(), "group": "h"}))
        assert sorted(discovery.desired_set()) == kept
        assert made[2].closed
        del fleet.apply
        await discovery.reconfigure(settings_of())
        assert fleet.applied[-1] == ["local"]
        assert made[1].closed
    finally:
        await discovery.stop()


async def test_each_shard_builds_only_the_discovered_targets_it_owns() -> None:
    """Three shards of one group's 60 addresses: every target on exactly one, none built on
    the others; the static target on every shard (its load shared), its info on its owner."""
    ports = range(9000, 9060)
    held: list[set[str]] = []
    for index in range(3):
        fleet = Recording()
        shard = {"index": index, "count": 3}
        discovery = Discovery(
            settings_of(group(), shard=shard), fleet, sources=lambda _: Scripted(found(*ports))
        )
        await discovery.start()
        await discovery.stop()
        held.append(set(fleet.whole[0]))
        assert set(fleet.applied[0]) == held[-1] | {"local"}
        built = discovery._groups[0].state._built
        assert set(built) == {name.removeprefix("g/") for name in held[-1]}
    assert sum(len(h) for h in held) == len(ports)
    assert set().union(*held) == {f"g/127.0.0.1:{p}" for p in ports}
    assert all(held)
