"""Redaction of registered secrets, however a server mangled them before they reached a log.

A server that echoes the key may JSON-escape it (`\\/`, `\\u0041`), percent-encode it, or
wrap it across lines (joined with a space by the error's one-line form); the error may also
be cut inside it. Each variant must come out as `[REDACTED]`, and text that only resembles
the key must come out unchanged.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import urllib.parse
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prober import logs
from prober.logs import (
    REDACTED,
    get_logger,
    printable_line,
    redact,
    register_secret,
    safe_line,
    setup_logging,
)

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
    # Split by what does not print (issue 25, item 3): the filter would join the pieces.
    "ansi_reset": SECRET[:6] + "\x1b[0m" + SECRET[6:],
    "ansi_json_escaped": SECRET[:6] + "\\u001b[31m" + SECRET[6:],
    "ansi_python_repr": SECRET[:6] + "\\x1b[1;31m" + SECRET[6:],
    "osc_title": SECRET[:4] + "\x1b]0;t\x07" + SECRET[4:],
    "zero_width_space": SECRET[:10] + "\u200b" + SECRET[10:],
    "format_chars": "\u2060".join(SECRET[i : i + 3] for i in range(0, len(SECRET), 3)),
    "bom_and_joiner": SECRET[:5] + "\ufeff" + SECRET[5:11] + "\u200d" + SECRET[11:],
    "controls": SECRET[:3] + "\x00" + SECRET[3:9] + "\x07" + SECRET[9:],
    "combining_mark": SECRET[:8] + "\u0336" + SECRET[8:],
    "line_separator": SECRET[:8] + "\u2028" + SECRET[8:],
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


# -- base64 echoes (issue 25, item 3) -------------------------------------------------------


def b64(prefix: str, url: bool = False) -> str:
    raw = (prefix + SECRET).encode()
    return (base64.urlsafe_b64encode if url else base64.b64encode)(raw).decode()


ENCODED = {
    "base64": ("", b64("")),
    "base64_bearer": ("Bearer ", b64("Bearer ")),
    "base64_offset_2": ("ab", b64("ab")),
    "base64_url_safe": ("Bearer ", b64("Bearer ", url=True)),
    "base64_wrapped": ("Bearer ", "\n".join(b64("Bearer ")[i : i + 8] for i in range(0, 52, 8))),
    "base64_percent": ("Bearer ", urllib.parse.quote(b64("Bearer "), safe="")),
    "base64_json_slash": ("ab", b64("ab").replace("/", "\\/")),
}


def key_pieces(width: int = 12) -> set[str]:
    """Every `width`-character piece of the key and of its base64 text at any offset."""
    texts = [SECRET]
    for pad in ("", "a", "ab"):
        for url in (False, True):
            full = b64(pad, url)
            texts.append(full[(len(pad) * 8 + 5) // 6 : (len(pad) + len(SECRET)) * 8 // 6])
    return {t[i : i + width] for t in texts for i in range(len(t) - width + 1)}


def visible(text: str) -> str:
    return "".join(urllib.parse.unquote(text).replace("\\/", "/").split())


@pytest.mark.parametrize("name", sorted(ENCODED))
def test_a_base64_echo_of_the_key_is_redacted(name: str) -> None:
    _prefix, encoded = ENCODED[name]
    out = redact(f'{{"error": "unauthorized", "seen": "{encoded}"}}')
    assert REDACTED in out, out
    assert not [p for p in key_pieces() if p in visible(out)], out


@pytest.mark.parametrize("name", sorted(ENCODED))
def test_a_cut_off_base64_echo_is_redacted(name: str) -> None:
    _, encoded = ENCODED[name]
    out = redact("HTTP 401: " + encoded[: len(encoded) * 2 // 3])
    assert not [p for p in key_pieces() if p in visible(out)], out


# -- one filter: every error text one printable line (issue 25, item 4) -------------------

HOSTILE_TEXT = [
    "line one\nline two",
    "clear\x1b[2J\x1b[Hscreen",
    "bell\x07 nul\x00 del\x7f",
    "lone \ud800 surrogate",
    'ok\n{"event": "probe_ok", "level": "info", "target": "forged"}',
    "title\x1b]0;owned\x07 and \x9b31m C1 CSI",
    "zero\u200bwidth\u2028separator\u2029paragraph\ufeff",
]


@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_printable_line_leaves_one_printable_line(text: str) -> None:
    out = printable_line(text)
    assert out.isprintable(), repr(out)
    assert not [s for s in ("\n", "\x1b", "[2J", "]0;") if s in out], repr(out)


@given(st.text(max_size=200), st.integers(min_value=0, max_value=300))
def test_property_printable_line_is_always_one_printable_line(text: str, limit: int) -> None:
    out = printable_line(text, limit)
    assert out.isprintable()
    assert len(out) <= limit
    assert out == " ".join(out.split())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_safe_line_never_joins_a_split_key(variant: str) -> None:
    out = safe_line(f"server error in stream: bad key {VARIANTS[variant]} given")
    assert out == f"server error in stream: bad key {REDACTED} given", repr(out)


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_log_lines_are_one_printable_line_without_the_key(fmt: str) -> None:
    out = io.StringIO()
    setup_logging(fmt, "info", stream=out)  # type: ignore[arg-type]
    hostile = ["\x1b[0m".join((SECRET[:9], SECRET[9:])), *HOSTILE_TEXT]
    try:
        for text in hostile:
            get_logger("test").warning("probe_failed", error=text)
            logging.getLogger("aiohttp.client").warning("stdlib %s", text)
    finally:
        setup_logging("json", "info")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 * len(hostile), lines
    for line in lines:
        assert not [p for p in key_pieces() if p in visible(line)], line
        assert not set(line) & set("\x00\x07\x7f\u200b\u2028\ud800"), repr(line)
        if fmt == "json":
            assert not [s for s in ("\\u001b", "\\ud800") if s in line], line
            json.loads(line)
        else:  # only the renderer's own colours: none of the server's sequences
            assert not [s for s in ("[2J", "]0;") if s in line], repr(line)


def test_an_escape_sequence_that_swallows_the_keys_first_character() -> None:
    # Found by the property above: a C1 CSI (`\x9b`) takes the key's `s` as its final byte,
    # and a JSON-escaped ESC later splits the rest; each sequence's characters may or may
    # not be the key's, so the match takes or skips each of them.
    out = redact("\x9b" + VARIANTS["ansi_json_escaped"])
    assert out == "\x9b" + REDACTED, repr(out)
