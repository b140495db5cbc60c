"""Property tests of the configuration loader: whatever the file or environment holds,
`load_settings` returns `Settings` or raises `ConfigError`, and every problem line names where
it is: a field path rooted in the document (`targets[0].url: ...`) or `config: ...`.

Three sources of input: arbitrary text as the file; documents shaped like a configuration
(real keys mixed with stray ones, any YAML value in any place); and arbitrary values in the
`LLMPROBER_*` variables beside a valid file. Run longer with `HYPOTHESIS_PROFILE=fuzz`
(docs/fuzzing.md).
"""

from __future__ import annotations

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
from prober.settings import ConfigError, Settings, load_settings

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
             "max_tokens", "max_tokens_spread", "seed"],
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
