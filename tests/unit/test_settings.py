"""prober.settings: each invalid config paired with its exact problem lines; the happy paths."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from prober import kinds
from prober.bench.cli import add_bench_parser
from prober.bench.config import BenchConfig
from prober.cli import build_parser, probe_target
from prober.request import BENCH_CONNECT_SECONDS, DEFAULT_TIMEOUTS, Api, Timeouts
from prober.settings import ConfigError, Settings, load_settings
from prober.sim import add_sim_arguments
from prober.web import FLEET, WEB, build_app

MINIMAL = """\
server:
  listen: "127.0.0.1:9470"
targets:
  - name: local
    url: http://127.0.0.1:8080/v1
    model: any
"""

# MINIMAL's one target, with a metrics endpoint and a load generator.
WITH_METRICS_AND_LOAD = MINIMAL + (
    "    metrics_url: http://127.0.0.1:8080/metrics\n    load: {rate: 2.0, max_in_flight: 64}\n"
)

NO_TARGETS = "targets: at least one target is required (or a target_groups entry)"
TARGET = "targets:\n  - name: a\n    url: http://x/v1\n    model: m\n"


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/unit/conftest.py


def load(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_settings(path)


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


# -- invalid configs -----------------------------------------------------------------------

INVALID = [
    pytest.param('server:\n  listen: "127.0.0.1:9470"\n', [NO_TARGETS], id="no-targets"),
    pytest.param("", [NO_TARGETS], id="empty-file"),
    pytest.param(
        "targets: []\n",
        [NO_TARGETS],
        id="empty-targets",
    ),
    pytest.param(
        "targets:\n  - name: a\n    model: m\n", ["targets[0].url: required"], id="missing-url"
    ),
    pytest.param(
        "targets:\n  - name: a\n    url: http://x/v1\n",
        ["targets[0].model: required"],
        id="missing-model",
    ),
    pytest.param(
        "targets:\n  - url: http://x/v1\n    model: m\n",
        ["targets[0].name: required"],
        id="missing-name",
    ),
    pytest.param(
        "targets:\n  - name: a\n",
        ["targets[0].url: required", "targets[0].model: required"],
        id="missing-url-and-model",
    ),
    pytest.param(
        "targets:\n  - name: a\n    url: ftp://x/v1\n    model: m\n",
        ["targets[0].url: must be an http:// or https:// URL, got 'ftp://x/v1'"],
        id="bad-url-scheme",
    ),
    pytest.param(
        TARGET + "    metrics_url: x:9090/metrics\n",
        ["targets[0].metrics_url: must be an http:// or https:// URL, got 'x:9090/metrics'"],
        id="bad-metrics-url",
    ),
    pytest.param(
        "targets:\n  - name: 'a b'\n    url: http://x/v1\n    model: m\n",
        [
            "targets[0].name: must be 1-330 of letters, digits, '_', '.', ':', '/', '[', ']',"
            " '-', got 'a b'"
        ],
        id="bad-name",
    ),
    pytest.param(
        "targets:\n  - name: a\n    url: http://x/v1\n    model: ' '\n",
        ["targets[0].model: must be a non-empty string, got ' '"],
        id="blank-model",
    ),
    pytest.param(
        TARGET + "    interval_seconds: 0\n",
        ["targets[0].interval_seconds: must be at least 0.1, got 0"],
        id="zero-interval",
    ),
    pytest.param(
        TARGET + "    interval_seconds: -5\n",
        ["targets[0].interval_seconds: must be at least 0.1, got -5"],
        id="negative-interval",
    ),
    pytest.param(
        TARGET + "    interval_seconds: 1\n    jitter_seconds: 2\n",
        ["targets[0].jitter_seconds: must be at most interval_seconds (1), got 2.0"],
        id="jitter-over-interval",
    ),
    pytest.param(
        TARGET + "    intervl_seconds: 5\n",
        ["targets[0].intervl_seconds: unknown key, did you mean interval_seconds?"],
        id="typo-in-target",
    ),
    pytest.param(
        TARGET + "logging:\n  levle: debug\n",
        ["logging.levle: unknown key, did you mean level?"],
        id="typo-nested",
    ),
    pytest.param(TARGET + "load: {rate: 2.0}\n", ["load: unknown key"], id="load-at-top-level"),
    pytest.param(
        'server:\n  listen: "9470"\n' + TARGET,
        ["server.listen: must be HOST:PORT, got '9470'"],
        id="listen-without-colon",
    ),
    pytest.param(
        'server:\n  listen: "127.0.0.1:70000"\n' + TARGET,
        ["server.listen: must be HOST:PORT, got '127.0.0.1:70000'"],
        id="listen-port-range",
    ),
    pytest.param(
        TARGET + "  - name: a\n    url: http://y/v1\n    model: m\n",
        ["targets: target names must be unique, repeated: a"],
        id="duplicate-names",
    ),
    pytest.param(
        TARGET + "    api_key_env: KEY\n    api_key_file: /tmp/key\n",
        ["targets[0].api_key_file: set api_key_env or api_key_file, not both"],
        id="both-api-key-sources",
    ),
    pytest.param(
        TARGET + "    api_key_env: LLMPROBER_TEST_SURELY_UNSET\n",
        ["targets[0].api_key_env: environment variable LLMPROBER_TEST_SURELY_UNSET is unset"],
        id="api-key-env-unset",
    ),
    pytest.param(
        TARGET + "    api_key_file: /nonexistent/llmprober.key\n",
        [
            "targets[0].api_key_file: cannot read /nonexistent/llmprober.key: "
            "No such file or directory"
        ],
        id="api-key-file-missing",
    ),
    pytest.param(
        TARGET + "    load: {rate: 0}\n",
        ["targets[0].load.rate: must be at least 1e-05, got 0"],
        id="load-rate-zero",
    ),
    pytest.param(
        TARGET + "    load: {rate: -1.5}\n",
        ["targets[0].load.rate: must be at least 1e-05, got -1.5"],
        id="load-rate-negative",
    ),
    pytest.param(
        TARGET + "    load: {max_in_flight: 4}\n",
        ["targets[0].load.rate: required (or a schedule, or a trace)"],
        id="load-rate-missing",
    ),
    pytest.param(
        TARGET + "    load: {rate: 1, max_in_flight: 0}\n",
        ["targets[0].load.max_in_flight: must be at least 1, got 0"],
        id="load-max-in-flight-zero",
    ),
    pytest.param(
        "shard: {index: 2, count: 2}\n" + TARGET,
        ["shard.index: must be less than count (2), got 2"],
        id="shard-index-too-high",
    ),
    pytest.param("targets: 5\n", ["targets: must be a list, got 5"], id="targets-not-a-list"),
]


@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_invalid_config_problems(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert problems(tmp_path, text) == expected


def test_several_faults_are_all_reported(tmp_path: Path) -> None:
    text = (
        'server:\n  listen: "nope"\n'
        "targets:\n  - name: a\n    url: ftp://x\n    model: m\n    intervl_seconds: 5\n"
    )
    assert problems(tmp_path, text) == [
        "server.listen: must be HOST:PORT, got 'nope'",
        "targets[0].url: must be an http:// or https:// URL, got 'ftp://x'",
        "targets[0].intervl_seconds: unknown key, did you mean interval_seconds?",
    ]


def test_api_key_problems_name_their_target_index(tmp_path: Path) -> None:
    text = TARGET + (
        "  - name: b\n    url: http://y/v1\n    model: m\n"
        "    api_key_env: LLMPROBER_TEST_SURELY_UNSET\n"
    )
    assert problems(tmp_path, text) == [
        "targets[1].api_key_env: environment variable LLMPROBER_TEST_SURELY_UNSET is unset"
    ]


def test_empty_api_key_file(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("\n")
    assert problems(tmp_path, TARGET + f"    api_key_file: {key}\n") == [
        f"targets[0].api_key_file: {key} is empty"
    ]


def test_missing_config_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.problems == [f"config: cannot read {path}: No such file or directory"]


@pytest.mark.parametrize(
    "text", ["targets:\n  - name: a\n    url: [http://x/v1\n", "targets:\n\t- name: a\n"]
)
def test_yaml_syntax_error_is_a_config_error(tmp_path: Path, text: str) -> None:
    found = problems(tmp_path, text)
    assert len(found) == 1
    assert found[0].startswith("config: ")
    assert "line " in found[0]


def test_yaml_top_level_not_a_mapping(tmp_path: Path) -> None:
    found = problems(tmp_path, "- a\n- b\n")
    assert len(found) == 1
    assert found[0].startswith("config: ")


# -- valid configs -------------------------------------------------------------------------


def test_minimal_config_as_written(tmp_path: Path) -> None:
    s = load(tmp_path, MINIMAL)
    assert (s.server.listen, s.server.host, s.server.port) == ("127.0.0.1:9470", "127.0.0.1", 9470)
    [t] = s.targets
    assert (t.name, t.url, t.model) == ("local", "http://127.0.0.1:8080/v1", "any")
    assert t.metrics_url is None
    assert t.load is None
    assert t.read_secrets() is None


def test_minimal_config_with_metrics_and_load(tmp_path: Path) -> None:
    [t] = load(tmp_path, WITH_METRICS_AND_LOAD).targets
    assert t.metrics_url == "http://127.0.0.1:8080/metrics"
    assert t.load is not None
    assert (t.load.rate, t.load.max_in_flight, t.load.arrival) == (2.0, 64, "poisson")


def test_defaults(tmp_path: Path) -> None:
    s = load(tmp_path, TARGET)
    [t] = s.targets
    assert t.interval_seconds == 15.0
    assert t.jitter_seconds == 1.0
    assert t.api is Api.CHAT
    assert (t.prompt_tokens, t.max_tokens, t.warmup, t.cache_bust) == (64, 16, 1, True)
    assert (
        t.timeouts.connect_seconds,
        t.timeouts.first_token_seconds,
        t.timeouts.idle_seconds,
        t.timeouts.total_seconds,
    ) == (5.0, 60.0, 30.0, 300.0)
    assert (t.slo.ttft_seconds, t.slo.tpot_seconds, t.slo.e2e_seconds) == (2.0, 0.2, None)
    assert t.tls.verify is True
    assert (s.server.listen, s.server.port, s.server.grace_seconds) == ("0.0.0.0:9470", 9470, 10.0)
    assert (s.logging.level, s.logging.format, s.logging.log_prompts) == ("info", "auto", False)
    assert (s.shard.index, s.shard.count) == (0, 1)


def test_ipv6_listen(tmp_path: Path) -> None:
    s = load(tmp_path, 'server:\n  listen: "[::1]:9470"\n' + TARGET)
    assert (s.server.host, s.server.port) == ("::1", 9470)


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMPROBER_SERVER__LISTEN", "0.0.0.0:9999")
    s = load(tmp_path, MINIMAL)
    assert s.server.listen == "0.0.0.0:9999"
    assert s.targets[0].name == "local"  # the rest still comes from the file


def test_environment_value_is_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMPROBER_SERVER__LISTEN", "nope")
    assert problems(tmp_path, MINIMAL) == ["server.listen: must be HOST:PORT, got 'nope'"]


def test_environment_alone_without_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "LLMPROBER_TARGETS", '[{"name": "env", "url": "http://h:1/v1", "model": "m"}]'
    )
    s = load_settings(None)
    assert [t.name for t in s.targets] == ["env"]


def test_api_key_from_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMPROBER_TEST_KEY", " sk-env \n")
    key = tmp_path / "key"
    key.write_text("sk-file\n")
    text = TARGET + "    api_key_env: LLMPROBER_TEST_KEY\n"
    text += f"  - name: b\n    url: http://y/v1\n    model: m\n    api_key_file: {key}\n"
    settings = load(tmp_path, text)
    a, b = settings.targets
    assert a.read_secrets() == "sk-env"
    assert b.read_secrets() == "sk-file"
    # The keys are held in private attributes, no field: never printed or dumped.
    assert "sk-" not in repr(settings)
    assert "sk-" not in str(settings.model_dump())


# -- one definition per closed set, one read per file ---------------------------------------


def test_closed_sets_come_from_kinds(tmp_path: Path) -> None:
    """Settings, bench flags and the simulator's flag take their choices from prober.kinds."""
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    add_sim_arguments(parser)
    choices = {a.dest: a.choices for p in [parser, *_subparsers(parser)] for a in p._actions}
    assert tuple(choices["arrival"] or ()) == kinds.ARRIVALS
    assert tuple(choices["event_loop"] or ()) == kinds.EVENT_LOOPS
    assert tuple(choices["sim_reasoning_field"] or ()) == kinds.REASONING_FIELDS
    assert list(choices["api"] or ()) == [api.value for api in kinds.Api]
    [t] = load(tmp_path, TARGET + "    engine: vllm\n    connection: fresh\n").targets
    assert t.engine is kinds.Engine.vllm
    assert t.connection == "fresh"


def test_probe_and_bench_take_their_timeouts_from_the_one_default() -> None:
    d = DEFAULT_TIMEOUTS
    args = build_parser().parse_args(["probe", "--url", "http://h/v1", "--model", "m"])
    assert probe_target(args).spec.timeouts == Timeouts(
        d.connect_seconds, d.first_token_seconds, d.idle_seconds, d.first_token_seconds
    )
    bench = BenchConfig(url="http://h/v1", model="m").target_config().timeouts.timeouts()
    total = d.total_seconds  # bench's --timeout: of the first token, and total
    assert bench == Timeouts(BENCH_CONNECT_SECONDS, total, d.idle_seconds, total)


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [p for group in groups for p in group.choices.values()]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("    engine: ollama\n",
         "targets[0].engine: must be one of 'vllm', 'llamacpp', 'sglang' or 'tgi', got 'ollama'"),
        ("    connection: reuse\n",
         "targets[0].connection: must be one of 'pooled' or 'fresh', got 'reuse'"),
        ("    load: {rate: 1, arrival: burst}\n",
         "targets[0].load.arrival: must be one of 'poisson', 'constant' or 'gamma', got 'burst'"),
    ],
)  # fmt: skip
def test_closed_set_faults_list_the_choices(tmp_path: Path, text: str, expected: str) -> None:
    assert problems(tmp_path, TARGET + text) == [expected]


def test_web_config_file_is_read_once(tmp_path: Path) -> None:
    """The daemon serves the web config that load_settings validated; it reads no file again."""
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users: {alice: '$2b$04$" + "a" * 53 + "'}\n")
    settings = load(tmp_path, f"server: {{web_config_file: {web}}}\n" + TARGET)
    web.unlink()
    app = build_app(settings)
    assert app[WEB].config is settings.server.web_config
    assert set(app[WEB].config.users) == {"alice"}
    assert load(tmp_path, TARGET).server.web_config.users == {}


async def test_the_api_key_is_read_once(tmp_path: Path) -> None:
    """The daemon sends with the key that load_settings read and checked; it reads no file
    again (nor registers the target's secrets twice)."""
    key = tmp_path / "key"
    key.write_text("sk-read-once-123456\n")
    settings = load(tmp_path, TARGET + f"    api_key_file: {key}\n")
    key.unlink()
    fleet = build_app(settings)[FLEET]
    await fleet.apply({t.name: t for t in settings.targets})
    try:
        [member] = fleet.members.values()
        assert member.target.spec.headers["Authorization"] == "Bearer sk-read-once-123456"
    finally:
        await fleet.drain(0.1)
        await fleet.close()


def test_web_config_faults_are_reported_beside_the_others(tmp_path: Path) -> None:
    text = f"server: {{listen: bad, web_config_file: {tmp_path / 'nope.yml'}}}\n" + TARGET
    assert problems(tmp_path, text) == [
        "server.listen: must be HOST:PORT, got 'bad'",
        f"server.web_config_file: cannot read {tmp_path / 'nope.yml'}: No such file or directory",
    ]


# -- booleans are not numbers (issue 25, item 9) ---------------------------------------------


def _numeric_fields() -> list[tuple[str, str]]:
    """(YAML path, section text builder key) of every int or float setting."""
    from prober import settings as s
    from prober.section import unwrap

    sections = {
        "server": s.ServerConfig, "shard": s.ShardConfig, "targets[0]": s.TargetConfig,
        "targets[0].timeouts": s.TimeoutsConfig, "targets[0].slo": s.SloConfig,
        "targets[0].load": s.LoadConfig, "targets[0].traffic": s.TrafficConfig,
    }  # fmt: skip
    found = []
    for where, model in sections.items():
        for name, info in model.model_fields.items():
            if unwrap(info.annotation) in (int, float):
                found.append((where, name))
    return found


# What a section needs besides the field under test, so that field's is the one fault.
_REQUIRED: dict[str, dict[str, object]] = {
    "load": {"rate": 1.0},
    "traffic": {"prompt_tokens": 20, "output_tokens": 120},
}


def _with_true(where: str, name: str) -> dict[str, object]:
    target: dict[str, object] = {"name": "a", "url": "http://x/v1", "model": "m"}
    doc: dict[str, object] = {"targets": [target]}
    if where in ("server", "shard"):
        doc[where] = {name: True}
    elif where == "targets[0]":
        target[name] = True
    else:
        section = where.rpartition(".")[2]
        target[section] = {**_REQUIRED.get(section, {}), name: True}
    return doc


NUMERIC_FIELDS = _numeric_fields()
INT_FIELDS = {"prompt_tokens", "max_tokens", "warmup", "max_in_flight", "seed", "slots",
              "probes_in_flight", "index", "count", "output_tokens"}  # fmt: skip


def test_every_numeric_field_is_found() -> None:
    names = {name for _, name in NUMERIC_FIELDS}
    assert {"max_tokens", "grace_seconds", "rate", "slots", "ttft_seconds", "count"} <= names


@pytest.mark.parametrize(("where", "name"), NUMERIC_FIELDS, ids=lambda v: str(v))
def test_a_bool_is_not_a_number_in_any_numeric_field(tmp_path: Path, where: str, name: str) -> None:
    found = problems(tmp_path, yaml.safe_dump(_with_true(where, name)))
    assert len(found) == 1, found
    noun = "an integer" if name in INT_FIELDS else "a number"
    assert found == [f"{where}.{name}: must be {noun}, got True"]
