"""Redaction of registered secrets, however a server mangled them before they reached a log.

A server that echoes the key may JSON-escape it (`\\/`, `\\u0041`), percent-encode it, or
wrap it across lines (joined with a space by the error's one-line form); the error may also
be cut inside it. Each variant must come out as `[REDACTED]`, and text that only resembles
the key must come out unchanged.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prober import logs
from prober.logs import REDACTED, redact, register_secret

SECRET = "sk-proj/AbC+dEf=0123456789xyz"


@pytest.fixture(autouse=True)
def only_this_secret() -> Iterator[None]:
    saved = set(logs._SECRETS)
    logs._SECRETS.clear()
    register_secret(SECRET)
    try:
        yield
    finally:
        logs._SECRETS.clear()
        logs._SECRETS.update(saved)


def unicode_escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" if i % 3 == 0 else c for i, c in enumerate(text))


VARIANTS = {
    "plain": SECRET,
    "json_slash": SECRET.replace("/", "\\/"),
    "json_dumps": json.dumps(SECRET)[1:-1],
    "unicode_escapes": unicode_escaped(SECRET),
    "percent_encoded": urllib.parse.quote(SECRET, safe=""),
    "split_lines": SECRET[:9] + "\n" + SECRET[9:],
    "split_crlf_indent": SECRET[:5] + "\r\n    " + SECRET[5:],
    "joined_with_space": SECRET[:12] + " " + SECRET[12:],
    "escaped_newline": SECRET[:7] + "\\n" + SECRET[7:],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_mangled_form_of_the_key_is_redacted(variant: str) -> None:
    text = f'{{"error": "bad key {VARIANTS[variant]} given"}}'
    out = redact(text)
    assert out == f'{{"error": "bad key {REDACTED} given"}}', out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_cut_off_start_of_a_mangled_key_is_redacted(variant: str) -> None:
    mangled = VARIANTS[variant]
    cut = mangled[: max(12, len(mangled) // 2)]  # at least 8 of the key's characters
    assert redact(f"HTTP 401: {cut}") == f"HTTP 401: {REDACTED}"


@pytest.mark.parametrize(
    "text",
    [
        "sk-proj",
        "sk-proj/AbC is not at the end",
        "a sk- b",
        "sk-proj AbC+ dEf= 012 nope",
        "%2Fsk",
        "\\u0041\\/",
        "plain text",
    ],
)
def test_text_that_is_not_the_key_is_left_alone(text: str) -> None:
    assert redact(text) == text


def test_two_secrets_next_to_each_other() -> None:
    other = "api-key-9876543210-zz"
    register_secret(other)
    out = redact(f"x {SECRET}{other} y {other[:10]}")
    assert out == f"x {REDACTED}{REDACTED} y {REDACTED}", out


@given(st.text(max_size=40), st.text(max_size=40), st.sampled_from(sorted(VARIANTS)))
def test_property_the_key_never_survives_whatever_surrounds_it(
    before: str, after: str, variant: str
) -> None:
    out = redact(before + VARIANTS[variant] + after)
    assert SECRET not in out
    assert REDACTED in out


def test_a_stray_backslash_before_an_escaped_key_does_not_hide_it() -> None:
    # Found by the property above: `\` + `\u0073k-…` once read as the escape `\\` and then
    # plain `u0073k-…`, which is not the key.
    out = redact("\\" + VARIANTS["unicode_escapes"] + " y")
    assert out == "\\" + REDACTED + " y", out
