"""Property tests of the configuration loader: whatever the file or environment holds,
`load_settings` returns `Settings` or raises `ConfigError`, and every problem line names where
it is: a field path rooted in the document (`targets[0].url: ...`) or `config: ...`.

Three sources of input: arbitrary text as the file; documents shaped like a configuration
(real keys mixed with stray ones, any YAML value in any place); and arbitrary values in the
`LLMPROBER_*` variables beside a valid file. Run longer with `HYPOTHESIS_PROFILE=fuzz`
(docs/fuzzing.md).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from prober import logs
from prober.bench.config import FLAGS, BenchConfig
from prober.settings import ConfigError, Settings, load_settings
from prober.sim import SimConfig
from prober.webconfig import WebConfigError, load_web_config

FIELDS = {
    "": ["server", "targets", "logging", "shard"],
    "server": ["listen", "grace_seconds", "web_config_file"],
    "target": ["name", "url", "model", "api", "interval_seconds", "jitter_seconds",
               "prompt_tokens", "max_tokens", "warmup", "cache_bust", "timeouts", "headers",
               "api_key_env", "api_key_file", "slo", "tls", "extra_body", "metrics_url",
               "engine", "metrics_interval_seconds", "load"],
    "timeouts": ["connect_seconds", "first_token_seconds", "idle_seconds", "total_seconds"],
    "slo": ["ttft_seconds", "tpot_seconds", "e2e_seconds"],
    "tls": ["verify", "ca_file"],
    "load": ["rate", "arrival", "max_in_flight", "prompt_tokens", "prompt_tokens_spread",
             "max_tokens", "max_tokens_spread", "seed", "burstiness", "schedule", "trace"],
    "logging": ["level", "format", "log_prompts"],
    "shard": ["index", "count"],
}  # fmt: skip
ENV_NAMES = [
    "LLMPROBER_SERVER", "LLMPROBER_SERVER__LISTEN", "LLMPROBER_SERVER__GRACE_SECONDS",
    "LLMPROBER_SERVER__WEB_CONFIG_FILE", "LLMPROBER_TARGETS", "LLMPROBER_LOGGING",
    "LLMPROBER_LOGGING__LEVEL", "LLMPROBER_LOGGING__LOG_PROMPTS", "LLMPROBER_SHARD",
    "LLMPROBER_SHARD__INDEX", "LLMPROBER_SHARD__COUNT", "LLMPROBER_NOPE", "LLMPROBER_SERVER__X",
]  # fmt: skip
VALID = "targets:\n  - name: a\n    url: http://127.0.0.1:1/v1\n    model: m\n"
# Text that YAML may turn into anything; no NUL (not in files users write) and no surrogates.
TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=200)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), TEXT,
    st.sampled_from(["http://127.0.0.1:1/v1", "https://x/v1", "chat", "poisson", "info",
                     "0.0.0.0:9470", "", "-1", "1e999", "nan", "/nonexistent/file"]),
)  # fmt: skip
ANY = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.one_of(TEXT, st.integers()), inner, max_size=3)
    ),
    max_leaves=8,
)


def section(kind: str) -> st.SearchStrategy[dict[Any, Any]]:
    """A mapping with some real keys of `kind`, the odd stray key, and values of any shape."""
    keys = st.sampled_from(FIELDS[kind]) | st.from_regex(r"[a-z_]{1,10}", fullmatch=True)
    nested = {"timeouts", "slo", "tls", "load"}
    values = st.deferred(lambda: st.one_of(ANY, *(section(k) for k in nested if kind == "target")))
    return st.dictionaries(keys, values, max_size=6)


DOCUMENTS = st.fixed_dictionaries(
    {},
    optional={
        "server": section("server") | ANY,
        "targets": st.lists(section("target"), max_size=3) | ANY,
        "logging": section("logging") | ANY,
        "shard": section("shard") | ANY,
        "stray": ANY,
    },
)


@contextmanager
def isolated() -> Iterator[Path]:
    """A temporary folder as cwd, no LLMPROBER_* variables, and the redaction list untouched
    (a fuzzed `api_key_env` may name a real variable, whose value would then be registered)."""
    saved_env, saved_cwd, saved_secrets = dict(os.environ), os.getcwd(), set(logs._SECRETS)
    for name in list(os.environ):
        if name.upper().startswith("LLMPROBER_"):
            del os.environ[name]
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        try:
            yield Path(folder)
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            logs._SECRETS.clear()
            logs._SECRETS.update(saved_secrets)


def check(path: Path, roots: set[str]) -> Settings | None:
    """Load `path`; on ConfigError, every line must start at a field in `roots` or `config`."""
    try:
        return load_settings(path)
    except ConfigError as exc:
        error = exc
    assert error.problems, "a ConfigError must say what is wrong"
    assert str(error) == "\n".join(error.problems)
    for line in error.problems:
        assert "\n" not in line, line
        assert names_a_field(line, roots | {"config"}), line
    return None


def names_a_field(line: str, roots: set[str]) -> bool:
    # Longest root first: a stray key "a.b" must not pass as the field "a".
    for root in sorted(roots, key=len, reverse=True):
        if line.startswith(root) and re.match(r"(\.|\[|: )", line[len(root) :]):
            return True
    return False


def roots_of(document: Any) -> set[str]:
    known = set(FIELDS[""])
    if isinstance(document, dict):
        # As settings.field_path shows them: a name with a line break quoted.
        known |= {str(k) if str(k).isprintable() else repr(k) for k in document}
    return known


def check_raw(data: str | bytes) -> None:
    """Write `data` as the config file, as YAML would read it, and check the outcome."""
    with isolated() as folder:
        path = folder / "config.yml"
        if isinstance(data, str):
            path.write_text(data)
        else:
            path.write_bytes(data)
        try:
            document = yaml.safe_load(data)
        except yaml.YAMLError:
            document = None
        check(path, roots_of(document))


@given(TEXT)
def test_property_arbitrary_text_raises_only_config_error(text: str) -> None:
    check_raw(text)


@given(st.binary(max_size=200))
def test_property_arbitrary_bytes_raise_only_config_error(data: bytes) -> None:
    check_raw(data)


@given(DOCUMENTS)
def test_property_config_shaped_documents_raise_only_config_error(document: Any) -> None:
    with isolated() as folder:
        path = folder / "config.yml"
        path.write_text(yaml.safe_dump(document, allow_unicode=True))
        check(path, roots_of(document))


@given(st.dictionaries(st.sampled_from(ENV_NAMES), TEXT, max_size=4))
def test_property_arbitrary_environment_raises_only_config_error(env: dict[str, str]) -> None:
    with isolated() as folder:
        path = folder / "config.yml"
        path.write_text(VALID)
        os.environ.update(env)
        roots = set(FIELDS[""]) | {n.removeprefix("LLMPROBER_").lower().split("__")[0] for n in env}
        check(path, roots)


def test_a_valid_file_still_loads() -> None:
    """The properties above would pass vacuously if every input failed: this one must not."""
    with isolated() as folder:
        path = folder / "config.yml"
        path.write_text(VALID)
        settings = check(path, set())
    assert settings is not None
    assert settings.targets[0].name == "a"


# -- hostile values, generated per class (issue 12) ---------------------------------------
#
# Each class is a field and a strategy of values that once passed validation and then crashed
# `run` (OverflowError on every probe, a traceback, a prompt on the terminal) or went out on
# the wire. Whatever value the strategy draws, loading must fail with exactly one line that
# names the field.

DURATIONS = [
    ("interval_seconds",), ("jitter_seconds",), ("metrics_interval_seconds",),
    ("timeouts", "connect_seconds"), ("timeouts", "first_token_seconds"),
    ("timeouts", "idle_seconds"), ("timeouts", "total_seconds"),
    ("slo", "ttft_seconds"), ("slo", "tpot_seconds"), ("slo", "e2e_seconds"),
]  # fmt: skip
BAD_SECONDS = st.sampled_from([math.inf, -math.inf, math.nan, 1e300, 1e20]) | st.floats(
    min_value=7 * 86_400 + 1, allow_infinity=True
)
CONTROL = st.sampled_from(["\r\n", "\n", "\r", "\x00", "\x7f", "\x1b", "\x0b"])
SAFE_TEXT = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=12)
BAD_PORTS = st.integers(65_536, 10**7) | st.sampled_from([0, -1])
BAD_URLS = st.one_of(
    BAD_PORTS.map(lambda port: f"http://127.0.0.1:{port}/v1"),
    st.tuples(CONTROL | st.just(" "), SAFE_TEXT).map(lambda p: f"http://h/v1{p[0]}{p[1]}"),
    st.sampled_from(["http://[::1/v1", "http://h:80x/v1", "http://user:pw@h/v1", "http:///v1"]),
)
BAD_NAMES = st.tuples(
    st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
    st.sampled_from(["\n", " ", "\t", "é", "?", "\r\n", "\x00"]),  # "/": {group}/{address}
).map("".join)
BAD_HEADER_VALUES = st.tuples(SAFE_TEXT, CONTROL, SAFE_TEXT).map("".join)
BAD_KEY_FILES = st.one_of(
    st.binary(max_size=40).map(lambda b: b"\xff" + b),  # never valid UTF-8
    st.tuples(SAFE_TEXT.filter(bool), st.sampled_from([b"\n", b"\r\n", b"\r"]),
              SAFE_TEXT.filter(bool)).map(lambda p: p[0].encode() + p[1] + p[2].encode()),
    st.tuples(SAFE_TEXT.filter(bool), st.sampled_from([b" ", b"\t", b"\x00", b"\x1b"]),
              SAFE_TEXT.filter(bool)).map(lambda p: p[0].encode() + p[1] + p[2].encode()),
    st.sampled_from([b"", b"  \n\n", "sk-é".encode()]),
)  # fmt: skip
NOT_PEM = st.binary(max_size=200).filter(lambda b: b"-----BEGIN" not in b)


def base_target() -> dict[str, Any]:
    return {"name": "a", "url": "http://127.0.0.1:1/v1", "model": "m"}


def expect_one_problem(document: dict[str, Any], field: str, folder: Path) -> None:
    path = folder / "config.yml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    try:
        load_settings(path)
    except ConfigError as exc:
        problems = exc.problems
    else:
        raise AssertionError(f"{field}: accepted")
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{field}: "), problems
    assert "\n" not in problems[0]
    assert "\r" not in problems[0]


@given(st.sampled_from(DURATIONS), BAD_SECONDS)
def test_property_durations_are_finite_and_bounded(path: tuple[str, ...], seconds: float) -> None:
    target = base_target()
    if path == ("jitter_seconds",):
        target["interval_seconds"] = 15
    node = target
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = seconds
    with isolated() as folder:
        expect_one_problem({"targets": [target]}, "targets[0]." + ".".join(path), folder)


@given(BAD_SECONDS | st.floats(max_value=0))
def test_property_grace_seconds_is_finite_and_bounded(seconds: float) -> None:
    with isolated() as folder:
        doc = {"server": {"grace_seconds": seconds}, "targets": [base_target()]}
        expect_one_problem(doc, "server.grace_seconds", folder)


@given(st.sampled_from(["url", "metrics_url"]), BAD_URLS)
def test_property_bad_urls_are_refused(field: str, url: str) -> None:
    with isolated() as folder:
        expect_one_problem({"targets": [{**base_target(), field: url}]}, f"targets[0].{field}",
                           folder)  # fmt: skip


@given(BAD_NAMES)
def test_property_target_names_are_one_clean_token(name: str) -> None:
    with isolated() as folder:
        expect_one_problem({"targets": [{**base_target(), "name": name}]}, "targets[0].name",
                           folder)  # fmt: skip


@given(st.sampled_from(["X-Team", "api-key", "X-Custom"]), BAD_HEADER_VALUES)
def test_property_header_values_carry_no_line_break(name: str, value: str) -> None:
    with isolated() as folder:
        target = {**base_target(), "headers": {name: value}}
        expect_one_problem({"targets": [target]}, "targets[0].headers", folder)


@given(st.sampled_from(["X-Request-Id", "accept-encoding", "Content-Length", "X-Team\n"]))
def test_property_reserved_or_malformed_header_names(name: str) -> None:
    with isolated() as folder:
        target = {**base_target(), "headers": {name: "v"}}
        expect_one_problem({"targets": [target]}, "targets[0].headers", folder)


@given(st.integers(65_536, 10**7).map(str) | st.sampled_from(["", "-1", "x", "٣٣", "80\n"]))
def test_property_listen_port_is_a_port(port: str) -> None:
    with isolated() as folder:
        doc = {"server": {"listen": f"0.0.0.0:{port}"}, "targets": [base_target()]}
        expect_one_problem(doc, "server.listen", folder)


@given(BAD_KEY_FILES)
def test_property_key_files_hold_one_printable_token(data: bytes) -> None:
    with isolated() as folder:
        key = folder / "key"
        key.write_bytes(data)
        target = {**base_target(), "api_key_file": str(key)}
        expect_one_problem({"targets": [target]}, "targets[0].api_key_file", folder)


@given(NOT_PEM)
def test_property_ca_file_must_hold_a_certificate(data: bytes) -> None:
    with isolated() as folder:
        ca = folder / "ca.pem"
        ca.write_bytes(data)
        target = {**base_target(), "url": "https://127.0.0.1:1/v1", "tls": {"ca_file": str(ca)}}
        expect_one_problem({"targets": [target]}, "targets[0].tls.ca_file", folder)


def test_secret_headers_must_name_configured_headers() -> None:
    with isolated() as folder:
        target = {**base_target(), "headers": {"X-A": "v"}, "secret_headers": ["X-B"]}
        expect_one_problem({"targets": [target]}, "targets[0].secret_headers", folder)


def test_secret_header_values_are_redacted_once_loaded() -> None:
    with isolated() as folder:
        target = {**base_target(), "headers": {"api-key": "azure-key-123456789",
                  "X-Token": "custom-token-98765", "X-Team": "search-team"},
                  "secret_headers": ["x-token"]}  # fmt: skip
        path = folder / "config.yml"
        path.write_text(yaml.safe_dump({"targets": [target]}))
        load_settings(path)
        assert logs.redact("azure-key-123456789 custom-token-98765 search-team") == (
            "[REDACTED] [REDACTED] search-team"
        )


# -- the other configurations: the simulator's, the bench's flags, the web config file -----
#
# Each is a pydantic model worded by prober/validation.py: whatever the values, building one
# succeeds or raises one line that starts with what the user wrote (a field, a flag, a key).


def shown(name: str) -> str:
    return name if name.isprintable() else repr(name)


@given(st.dictionaries(st.sampled_from(list(SimConfig.model_fields)) | TEXT, ANY, max_size=4))
def test_property_sim_config_faults_are_one_line_naming_the_field(values: dict[str, Any]) -> None:
    try:
        SimConfig(**values)
    except ValueError as exc:
        line = str(exc)
        assert "\n" not in line, line
        assert any(line.startswith(shown(name)) for name in values), line


BENCH_FIELDS = [name for name in BenchConfig.model_fields if name not in ("url", "model")]


def _stray(name: str) -> bool:
    return name not in ("", "url", "model")  # url and model are given; "" is no argument name


@given(st.dictionaries(st.sampled_from(BENCH_FIELDS) | TEXT.filter(_stray), ANY, max_size=4))
def test_property_bench_faults_are_one_line_naming_the_flag(values: dict[str, Any]) -> None:
    with isolated():
        try:
            BenchConfig(url="http://127.0.0.1:1/v1", model="m", **values)
        except ValueError as exc:
            line = str(exc)
            assert "\n" not in line, line
            unknown = [shown(name) for name in values if name not in FLAGS]
            assert re.match(r"--[a-z0-9-]+( / --[a-z0-9-]+)?: ", line) or any(
                line.startswith(f"{name}: ") for name in unknown
            ), line


WEB_KEYS = ["tls_server_config", "basic_auth_users", "cert_file", "key_file", "min_version"]
WEB_DOCUMENTS = st.dictionaries(
    st.sampled_from(WEB_KEYS) | TEXT,
    ANY | st.dictionaries(st.sampled_from(WEB_KEYS) | TEXT, ANY, max_size=3),
    max_size=3,
)


@given(WEB_DOCUMENTS)
def test_property_web_config_faults_are_one_line_naming_the_key(document: dict[str, Any]) -> None:
    with isolated() as folder:
        path = folder / "web.yml"
        path.write_text(yaml.safe_dump(document, allow_unicode=True))
        keys = [shown(str(key)) for key in yaml.safe_load(path.read_text()) or {}]
        try:
            load_web_config(path)
        except WebConfigError as exc:
            problems = exc.problems
        else:
            return
    assert problems
    for line in problems:
        assert "\n" not in line, line
        assert any(line.startswith(key) for key in keys), line
