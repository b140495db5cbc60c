"""prober.request.sse: SSE framing (line ends, split reads, comments, limits) and its property
tests.

The property tests (`test_property_*`) run 200 examples each by default and 20,000 under
`HYPOTHESIS_PROFILE=fuzz` (docs/fuzzing.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prober.request.sse import (
    DEFAULT_MAX_LINE_BYTES,
    MAX_EVENT_LINES,
    LineSplitter,
    SSEEvent,
    SSEParser,
    StreamError,
)


def parse(chunks: Iterable[bytes], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> list[SSEEvent]:
    """Every event a parser yields for `chunks`, end of stream included."""
    parser = SSEParser(max_line_bytes)
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events + parser.close()


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


# -- line ends ---------------------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_each_line_end_frames_events(eol: bytes) -> None:
    stream = b"data: one" + eol + eol + b"data: two" + eol + eol
    assert parse([stream]) == [SSEEvent("one"), SSEEvent("two")]


def test_mixed_line_ends_in_one_stream() -> None:
    stream = b"data: a\r\ndata: b\n\r\ndata: c\r\rdata: d\n\n"
    assert parse([stream]) == [SSEEvent("a\nb"), SSEEvent("c"), SSEEvent("d")]


def test_crlf_split_across_reads_is_one_line_end() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n\n") == [SSEEvent("a")]
    assert parser.close() == []


def test_split_crlf_does_not_end_the_event_early() -> None:
    # Were the CR taken as a line end and the LF as a blank line, "a" would go out alone.
    assert parse([b"data: a\r", b"\ndata: b\r\n\r\n"]) == [SSEEvent("a\nb")]
    assert parse([b"data: a\r\n\r", b"\n"]) == [SSEEvent("a")]


def test_lone_cr_at_end_of_read_then_more_data() -> None:
    assert parse([b"data: a\r", b"data: b\r\r"]) == [SSEEvent("a\nb")]


# -- fields --------------------------------------------------------------------------------


def test_comments_are_ignored() -> None:
    stream = b": keep-alive\n\n:ping\n\ndata: x\n: between lines\ndata: y\n\n: trailing\n"
    assert parse([stream]) == [SSEEvent("x\ny")]


def test_keepalive_only_stream_yields_nothing() -> None:
    assert parse([b": keep-alive\r\n\r\n" * 5]) == []


def test_multiline_data_is_joined_with_newline() -> None:
    assert parse([b"data: first\ndata: second\ndata: third\n\n"]) == [
        SSEEvent("first\nsecond\nthird")
    ]


def test_data_value_loses_one_leading_space_only() -> None:
    assert parse([b"data:x\n\ndata:  two\n\ndata:\n\n"]) == [
        SSEEvent("x"),
        SSEEvent(" two"),
        SSEEvent(""),
    ]


def test_data_without_colon_is_an_empty_line_of_data() -> None:
    assert parse([b"data\ndata: b\n\n"]) == [SSEEvent("\nb")]


def test_event_field_names_the_event_and_resets_after_dispatch() -> None:
    stream = b"event: error\ndata: {}\n\ndata: next\n\n"
    assert parse([stream]) == [SSEEvent("{}", "error"), SSEEvent("next", "")]


def test_event_without_data_dispatches_nothing() -> None:
    assert parse([b"event: ping\n\ndata: x\n\n"]) == [SSEEvent("x")]


def test_id_and_retry_are_accepted_and_ignored() -> None:
    assert parse([b"id: 7\nretry: 1000\ndata: x\n\n"]) == [SSEEvent("x")]


def test_done_sentinel_is_an_ordinary_event() -> None:
    assert parse([b'data: {"a":1}\n\ndata: [DONE]\n\n']) == [
        SSEEvent('{"a":1}'),
        SSEEvent("[DONE]"),
    ]


def test_blank_lines_without_data_dispatch_nothing() -> None:
    assert parse([b"\n\n\r\n\r\r"]) == []


# -- end of stream -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tail", [b"data: [DONE]\n", b"data: [DONE]", b"data: [DONE]\r", b"data: [DONE]\r\n"]
)
def test_done_ends_the_stream_once_its_line_is_complete(tail: bytes) -> None:
    # No blank line needed: `data: [DONE]` is dispatched as soon as its line ends, or at close.
    parser = SSEParser()
    events = parser.feed(b"data: a\n\n" + tail)
    ended = tail.endswith(b"\n")  # a lone CR may be half a CRLF: held for the next read
    assert events == ([SSEEvent("a"), SSEEvent("[DONE]")] if ended else [SSEEvent("a")])
    assert parser.close() == ([] if ended else [SSEEvent("[DONE]")])


def test_pending_data_is_dispatched_at_close() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n\ndata: b") == [SSEEvent("a")]
    assert parser.close() == [SSEEvent("b")]


@pytest.mark.parametrize(
    "junk",
    [b"not a field\n", b"data: x\n\n", b"\xff\xfe\n\n", b"x" * 100, b"x" * 100 + b"\n"],
    ids=["bad-field", "more-events", "bad-utf8", "long-unterminated", "long-line"],
)
@pytest.mark.parametrize("done", [b"data: [DONE]\n\n", b"data: [DONE]\n", b"data:[DONE]\r\n"])
def test_nothing_after_done_is_parsed(done: bytes, junk: bytes) -> None:
    # In the same read or the next: junk after the end is never an error, never an event.
    for reads in ([b"data: a\n\n" + done + junk], [b"data: a\n\n" + done, junk]):
        parser = SSEParser(max_line_bytes=64)
        events = [e for read in reads for e in parser.feed(read)]
        assert events == [SSEEvent("a"), SSEEvent("[DONE]")]
        assert parser.close() == []


def test_over_long_line_after_complete_lines_raises_on_the_next_call() -> None:
    parser = SSEParser(max_line_bytes=16)
    assert parser.feed(b"data: a\n\n" + b"x" * 40) == [SSEEvent("a")]
    with pytest.raises(StreamError, match="line longer than 16 bytes"):
        parser.close()


def test_close_with_nothing_pending() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n\n") == [SSEEvent("a")]
    assert parser.close() == []


# -- split reads ---------------------------------------------------------------------------

RECORDED = (
    b": keep-alive\r\n\r\n"
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\r\n\r\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hello \xc3\xa9\xe2\x82\xac"}}]}'
    b"\r\n\r\n"
    b"event: message\ndata: line one\ndata: line two\n\n"
    b"data: lone cr\r\r"
    b"data: [DONE]\n\n"
)


def test_split_at_every_byte_position_matches_one_feed() -> None:
    whole = parse([RECORDED])
    assert len(whole) == 5
    for i in range(len(RECORDED) + 1):
        assert parse([RECORDED[:i], RECORDED[i:]]) == whole, f"split at byte {i}"


def test_one_byte_reads_match_one_feed() -> None:
    assert parse(bytewise(RECORDED)) == parse([RECORDED])


def test_multibyte_utf8_split_across_reads() -> None:
    data = "data: é€😀\n\n".encode()
    for i in range(len(data) + 1):
        assert parse([data[:i], data[i:]]) == [SSEEvent("é€😀")]


# -- malformed input -----------------------------------------------------------------------


def test_over_long_line_raises() -> None:
    with pytest.raises(StreamError, match="line longer than 16 bytes"):
        parse([b"data: " + b"x" * 100 + b"\n\n"], max_line_bytes=16)


def test_unterminated_line_raises_once_the_limit_is_passed() -> None:
    # Bounded memory: a server that never sends a line end is cut off, not buffered forever.
    parser = SSEParser(max_line_bytes=64)
    for _ in range(4):
        assert parser.feed(b"data: xxxxxxxx") == []  # 56 bytes held
    with pytest.raises(StreamError, match="line longer than 64 bytes"):
        parser.feed(b"data: xxxxxxxx")


def test_line_at_the_limit_is_accepted() -> None:
    line = b"data: " + b"x" * 10  # 16 bytes
    assert parse([line + b"\n\n"], max_line_bytes=16) == [SSEEvent("x" * 10)]


def test_line_at_the_limit_with_crlf_split_after_cr() -> None:
    line = b"data: " + b"x" * 10  # 16 bytes
    assert parse([line + b"\r", b"\n\r\n"], max_line_bytes=16) == [SSEEvent("x" * 10)]


def test_over_long_line_split_across_reads_raises() -> None:
    with pytest.raises(StreamError):
        parse([b"data: abcdefghij", b"klmnop\n\n"], max_line_bytes=16)


@pytest.mark.parametrize(
    "stream",
    [b"data: \xff\xfe\n\n", b"data: ok\ndata: \xc3\n\n", b"event: \xff\ndata: x\n\n"],
    ids=["bad-bytes", "truncated-sequence", "bad-event-name"],
)
def test_invalid_utf8_raises(stream: bytes) -> None:
    with pytest.raises(StreamError, match="not UTF-8"):
        parse([stream])


def test_invalid_utf8_pending_at_close_raises() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: \xff") == []
    with pytest.raises(StreamError, match="not UTF-8"):
        parser.close()


@pytest.mark.parametrize(
    "line", [b"foo: bar", b'{"id": 1}', b"Data: x", b"retryx: 1", b"\xef\xbb\xbfdata: x"]
)
def test_unknown_field_raises(line: bytes) -> None:
    with pytest.raises(StreamError, match="not an SSE field"):
        parse([line + b"\n\n"])


# -- LineSplitter (NDJSON framing) ---------------------------------------------------------


def test_line_splitter_keeps_empty_lines_and_flushes_the_rest() -> None:
    lines = LineSplitter()
    assert lines.feed(b'{"a":1}\r\n\n{"b"') == [b'{"a":1}', b""]
    assert lines.feed(b":2}\r") == []
    assert lines.close() == [b'{"b":2}']


def test_line_splitter_over_long_line_raises() -> None:
    with pytest.raises(StreamError):
        LineSplitter(8).feed(b"0123456789\n")


# -- properties ----------------------------------------------------------------------------

EOLS = ("\n", "\r\n", "\r")
_line_text = st.text(st.characters(blacklist_characters="\r\n", codec="utf-8"), max_size=40)


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, list[SSEEvent]]:
    """A valid stream and the events it must yield, whatever its line ends and comments."""
    lines: list[str] = []
    expected: list[SSEEvent] = []
    n_events = draw(st.integers(0, 6))
    for i in range(n_events):
        if draw(st.booleans()):
            lines.append(":" + draw(_line_text))
        name = draw(st.none() | _line_text)
        if name is not None:
            lines.append("event: " + name)
        # A first line `[DONE]` ends the stream by design (module docstring): not a data line.
        data = draw(st.lists(_line_text, min_size=1, max_size=3).filter(lambda d: d[0] != "[DONE]"))
        lines += ["data: " + d for d in data]
        expected.append(SSEEvent("\n".join(data), name or ""))
        # The last event may end without its blank line: close() still dispatches it.
        if i < n_events - 1 or draw(st.booleans()):
            lines.append("")
    eols = [draw(st.sampled_from(EOLS)) for _ in lines]
    return _join(lines, eols).encode(), expected


def _join(lines: list[str], eols: list[str]) -> str:
    out = []
    for i, (line, eol) in enumerate(zip(lines, eols, strict=True)):
        # A lone CR followed by an empty LF-ended line would read as one CRLF: avoid the
        # ambiguity, which is the SSE spec's and not the parser's.
        if i and eols[i - 1] == "\r" and line == "" and eol == "\n":
            eol = "\r\n"
            eols[i] = eol
        out.append(line + eol)
    return "".join(out)


def cuts_for(data: bytes) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, len(data)), max_size=12)


@given(st.data())
def test_property_valid_stream_any_split_same_events(data: st.DataObject) -> None:
    stream, expected = data.draw(sse_streams())
    whole = parse([stream])
    assert whole == expected
    cuts = data.draw(cuts_for(stream))
    assert parse(split_at(stream, cuts)) == whole


@given(st.data())
def test_property_valid_stream_bytewise_same_events(data: st.DataObject) -> None:
    stream, expected = data.draw(sse_streams())
    assert parse(bytewise(stream)) == expected


@given(st.data())
def test_property_line_splitter_any_split_same_lines(data: st.DataObject) -> None:
    lines = data.draw(st.lists(_line_text, max_size=10))
    eols = [data.draw(st.sampled_from(EOLS)) for _ in lines]
    stream = _join(lines, eols).encode()
    cuts = data.draw(cuts_for(stream))
    splitter = LineSplitter()
    got: list[bytes] = []
    for chunk in split_at(stream, cuts):
        got += splitter.feed(chunk)
    got += splitter.close()
    expected = [line.encode() for line in lines]
    if lines and lines[-1] == "" and eols[-1] == "\r":
        # A final empty line ended by a lone CR: close() drops it (harmless, as NDJSON and
        # SSE both skip empty lines at end of stream).
        expected.pop()
    assert got == expected


# Pieces that reach every branch of the parser more often than uniform bytes would.
_PIECES = st.sampled_from(
    [b"data:", b"data: ", b"event:", b"id:", b"retry:", b":", b" ", b"\r", b"\n", b"\r\n",
     b"[DONE]", b"{}", b"x", b"\xff", b"\xc3", b"\xa9", b"foo", b"data", b"\x00"]
)  # fmt: skip
_noisy_bytes = st.binary(max_size=300) | st.lists(_PIECES, max_size=80).map(b"".join)
_limits = st.sampled_from([1, 2, 5, 16, 64, DEFAULT_MAX_LINE_BYTES])


@given(_noisy_bytes, st.data(), _limits)
def test_property_arbitrary_bytes_raise_only_stream_error(
    stream: bytes, data: st.DataObject, limit: int
) -> None:
    chunks = split_at(stream, data.draw(cuts_for(stream)))
    try:
        events = parse(chunks, max_line_bytes=limit)
    except StreamError:
        return
    assert all(isinstance(e.data, str) and isinstance(e.event, str) for e in events)


@given(_noisy_bytes, st.data(), _limits)
def test_property_line_splitter_arbitrary_bytes_raise_only_stream_error(
    stream: bytes, data: st.DataObject, limit: int
) -> None:
    splitter = LineSplitter(limit)
    try:
        for chunk in split_at(stream, data.draw(cuts_for(stream))):
            for line in splitter.feed(chunk):
                assert b"\n" not in line
                assert b"\r" not in line
        splitter.close()
    except StreamError:
        pass


# -- per-event bounds (issue 25, item 7) -----------------------------------------------------


def test_an_event_of_many_data_lines_fails_at_the_line_bound() -> None:
    """500,000 `data:` lines in one event (3 MB) once grew the pending event to ~45 MB of
    list and stalled the loop 314 ms before its blank line; it now fails at the bound."""
    parser = SSEParser()
    body = b"data: {}\n" + b"data:\n" * 500_000 + b"\n"
    reads = [body[at : at + 4096] for at in range(0, len(body), 4096)]
    parser.feed(reads[0])  # 680 lines: within the bound
    with pytest.raises(StreamError, match=f"more than {MAX_EVENT_LINES} data lines"):
        parser.feed(reads[1])  # the read that crosses it, not the event's end (read 733)


def test_an_event_larger_than_the_line_bound_fails_before_its_end() -> None:
    parser = SSEParser(max_line_bytes=1000)
    for _ in range(9):
        parser.feed(b"data: " + b"x" * 100 + b"\n")
    with pytest.raises(StreamError, match="event larger than 1000 bytes"):
        parser.feed(b"data: " + b"x" * 100 + b"\n")


def test_an_event_within_both_bounds_is_whole() -> None:
    lines = [b"data: " + str(i).encode() for i in range(MAX_EVENT_LINES)]
    [event] = parse([b"\n".join(lines) + b"\n\n"])
    assert event.data.split("\n") == [str(i) for i in range(MAX_EVENT_LINES)]


# -- a stream's line bound (round two: floods of keep-alive comments) -------------------------


def test_a_flood_of_comments_fails_at_the_streams_line_bound() -> None:
    """3 MiB of `: keep-alive` lines carry no event; parsing them cost 110 ms a request."""
    parser = SSEParser(max_lines=100)
    assert parser.feed(b": keep-alive\n" * 60) == []
    with pytest.raises(StreamError, match="more than 100 lines in one stream"):
        parser.feed(b": keep-alive\n" * 60)


def test_every_line_counts_whole_events_too() -> None:
    parser = SSEParser(max_lines=6)
    assert len(parser.feed(b"data: 1\n\ndata: 2\n\n")) == 2  # the fast path: 2 lines each
    assert len(parser.feed(b"event: x\ndata: 3\n")) == 0
    with pytest.raises(StreamError, match="more than 6 lines"):
        parser.feed(b"\n")


def test_an_end_within_the_line_bound_ends_the_stream_whatever_follows() -> None:
    parser = SSEParser(max_lines=10)
    events = parser.feed(b": ka\n" * 8 + b"data: [DONE]\n" + b": ka\n" * 1000)
    assert [e.data for e in events] == ["[DONE]"]
    assert parser.feed(b": ka\n" * 1000) == []  # nothing after the end is parsed
