"""What each open-loop request is: its prompt and answer lengths, or a line of a replayed trace.

**Lengths.** A `LengthSampler` draws token counts from one seeded `random.Random`: `Fixed`,
`Uniform` (integers in [low, high], both included), `Truncated` normal or lognormal, and
`Empirical` (values, optional weights). Truncation is exact, not clipping: a draw comes from
the distribution conditioned on [low, high] (as if redrawn until it fell inside), by inverse
CDF, so no mass piles up on the bounds and there is no redraw loop. Each integer n takes the
mass of [n − ½, n + ½). A window holding less than `MIN_MASS` of the distribution is refused
when the sampler is built, i.e. when the configuration is read.

**Traces** are JSONL, one request per line, sorted by time:
`{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [..]}`,
`hash_ids` optional: Mooncake's published format as it is (each id one block of prompt,
512 tokens in Mooncake; other keys are ignored). `read_trace` streams the file and checks
every line; any fault is one `TraceError`, "FILE:LINE: problem". Bounds: a file of at most
`MAX_TRACE_BYTES`, a line of at most `MAX_LINE_BYTES`, `MAX_HASH_IDS` ids a line, lengths
up to `MAX_TOKENS`, timestamps finite, non-decreasing and within `MAX_SPAN_MS` of the first.
Nothing of the file is held but the line being read. Only a regular file is read: the path
is opened non-blocking and checked (`fstat`) before a byte is read, so a FIFO or a device is
refused at once instead of blocking the open. Reading blocks: the load driver reads off the
event loop (prober/load/driver.py).

**Pace.** However a trace is scaled, the requests due in the first t seconds of a pass are at
most `MAX_RATE` × t + `MAX_BURST` (`Pace`: a token bucket over the replay's own timeline,
each line counting `rate_scale` requests). The bound is checked as lines stream, at load time
(`check_trace`) and on every pass of a replay alike, so a file replaced mid-run by a million
lines at one instant ends its load after the bucket's worth, never floods the loop.

**Replay** (`replay`) turns the trace into offsets from the first line's timestamp, times
`time_scale`. `rate_scale` changes the volume on the same timeline: each line is sent
⌊k⌋ times and once more with probability k − ⌊k⌋ (seeded); below 1 that thins the trace.
A looped trace starts its next pass one mean gap after its last line, so one pass lasts
span × n / (n − 1). Each pass reads the file again and is checked as the first was (its
offsets from its own first line); a pass that reads no request (the file emptied, or left
blank) or whose lines run past the first pass's span is a `TraceError`: the load ends there.
Prefix sharing is the trace's: requests whose leading hash ids agree get the same leading text
(`prompts.SharedPrefix`). Every copy and every pass is its own set of prefixes (its ids are
offset), so a second pass is not served from the first pass's cache.
"""

from __future__ import annotations

import json
import math
import os
import random
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from statistics import NormalDist
from typing import Any, BinaryIO

from prober.prompts import SharedPrefix

MAX_TOKENS = 1_000_000
MIN_MASS = 1e-9
MAX_TRACE_BYTES = 64 * 2**20
MAX_LINE_BYTES = 64 * 2**10
MAX_HASH_IDS = 4096
MAX_HASH_ID = 2**63 - 1
MAX_SPAN_MS = 7 * 86_400_000
MAX_RATE = 10_000.0  # requests/s a replay may send, on average and as a bucket's rate
MAX_BURST = 10_000.0  # requests a replay may have due at one instant (the bucket's depth)
_ID_BITS = 64  # hash ids of copy or pass j are j << 64 | id: never equal to another's
BUILTIN = "builtin:"
BUILTIN_TRACES = Path(__file__).parent / "traces"


class LengthSampler:
    """Token counts from one distribution; `nominal` is its median (pre-flight, warm-up)."""

    nominal: int

    def draw(self, rng: random.Random) -> int:
        raise NotImplementedError


class Fixed(LengthSampler):
    def __init__(self, value: int) -> None:
        self.nominal = value

    def draw(self, rng: random.Random) -> int:
        return self.nominal


class Uniform(LengthSampler):
    def __init__(self, low: int, high: int) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"bounds must satisfy 1 <= min <= max, got [{low}, {high}]")
        self.low, self.high = low, high
        self.nominal = (low + high) // 2

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


class Truncated(LengthSampler):
    """Normal (or, with `log`, lognormal: the normal of ln n) conditioned on [low, high]."""

    def __init__(self, dist: NormalDist, low: int, high: int, *, log: bool = False) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"bounds must satisfy 1 <= min <= max, got [{low}, {high}]")
        self.low, self.high, self._dist, self._log = low, high, dist, log
        lo, hi = low - 0.5, high + 0.5
        lo, hi = (math.log(lo), math.log(hi)) if log else (lo, hi)
        # Above the mean, work in the mirror image: probabilities near 1 lose their digits.
        self._mirror = lo > dist.mean
        if self._mirror:
            lo, hi = 2 * dist.mean - hi, 2 * dist.mean - lo
        self._a, self._b = dist.cdf(lo), dist.cdf(hi)
        if self._b - self._a < MIN_MASS:
            raise ValueError(
                f"[min, max] = [{low}, {high}] holds less than {MIN_MASS:g} of the distribution"
            )
        self.nominal = self._at(0.5)

    def _at(self, share: float) -> int:
        u = self._a + share * (self._b - self._a)
        x = self._dist.inv_cdf(min(max(u, 5e-324), 1 - 2**-53))
        if self._mirror:
            x = 2 * self._dist.mean - x
        value = math.exp(x) if self._log else x
        return min(self.high, max(self.low, round(value)))

    def draw(self, rng: random.Random) -> int:
        return self._at(rng.random())


class Empirical(LengthSampler):
    def __init__(self, values: Sequence[int], weights: Sequence[float] | None = None) -> None:
        if not values or (weights is not None and len(weights) != len(values)):
            raise ValueError("weights must give one weight per value")
        self._values = list(values)
        cum = list(accumulate(weights if weights is not None else [1.0] * len(values)))
        if not cum[-1] > 0 or not math.isfinite(cum[-1]):
            raise ValueError("weights must not all be 0")
        self._cum = cum
        order = sorted(range(len(values)), key=lambda i: values[i])
        half, seen = cum[-1] / 2, 0.0
        self.nominal = values[order[-1]]
        for i in order:  # the weighted median
            seen += cum[i] - (cum[i - 1] if i else 0.0)
            if seen >= half:
                self.nominal = values[i]
                break

    def draw(self, rng: random.Random) -> int:
        return rng.choices(self._values, cum_weights=self._cum)[0]


def normal(mean: float, std: float, low: int, high: int) -> Truncated:
    return Truncated(NormalDist(mean, std), low, high)


def lognormal(median: float, sigma: float, low: int, high: int) -> Truncated:
    """Lognormal of median `median` (mean median·e^(σ²/2) before truncation)."""
    return Truncated(NormalDist(math.log(median), sigma), low, high, log=True)


# -- traces -----------------------------------------------------------------------------------


class TraceError(ValueError):
    """A trace that cannot be replayed: one line, `FILE:LINE: problem` (or `FILE: problem`)."""

    def __init__(
        self, path: Path, problem: str, line: int | None = None, *, reason: str = "invalid"
    ) -> None:
        shown = str(path) if str(path).isprintable() else repr(str(path))
        where = f"{shown}:{line}" if line is not None else shown
        super().__init__(f"{where}: {problem}")
        self.reason = reason  # invalid, unreadable, empty, pace, changed: a metric's label


@dataclass(frozen=True, slots=True)
class TraceRequest:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()
    line: int = field(default=0, compare=False)  # where in the file (1 is the first line)


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """What a full read of a trace found: enough to scale and loop it without reading it again."""

    requests: int
    first_ms: float
    last_ms: float
    mean_input: float
    mean_output: float
    shares_prefixes: bool  # some line has hash ids

    @property
    def period_seconds(self) -> float:
        """One pass of a looped replay at time scale 1: the span plus one mean gap (0 if the
        trace has a single instant)."""
        span = (self.last_ms - self.first_ms) / 1000
        return span * self.requests / (self.requests - 1) if self.requests > 1 else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second over a pass at time scale 1 (0 for a single instant)."""
        period = self.period_seconds
        return self.requests / period if period > 0 else 0.0


def resolve_trace(text: str) -> Path:
    """A trace file's path: `builtin:NAME` names one shipped in `prober/load/traces/`."""
    if text.startswith(BUILTIN):
        name = text.removeprefix(BUILTIN)
        shipped = sorted(p.stem for p in BUILTIN_TRACES.glob("*.jsonl"))
        if name not in shipped:
            raise ValueError(f"no built-in trace {name!r} (there are: {', '.join(shipped)})")
        return BUILTIN_TRACES / f"{name}.jsonl"
    return Path(text)


def read_trace(path: Path) -> Iterator[TraceRequest]:
    """Every request of the trace in order, read as it is consumed; `TraceError` on a fault.
    Blocking file I/O: off the event loop in the daemon."""
    try:
        with _open_regular(path) as f:
            yield from _lines(path, f)
    except OSError as exc:
        problem = f"cannot read: {exc.strerror or exc}"
        raise TraceError(path, problem, reason="unreadable") from None
    except ValueError as exc:  # a NUL in the path, and the TraceErrors raised below
        if isinstance(exc, TraceError):
            raise
        raise TraceError(path, f"cannot read: {exc}", reason="unreadable") from None


def _open_regular(path: Path) -> BinaryIO:
    """The file open for reading, if it is a regular file within the size bound: opened
    non-blocking so a FIFO cannot hold the open, then checked before any byte is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            problem = "cannot read: not a regular file (a FIFO, device or directory is refused)"
            raise TraceError(path, problem, reason="unreadable")
        if info.st_size > MAX_TRACE_BYTES:
            mib = MAX_TRACE_BYTES // 2**20
            raise TraceError(path, f"{info.st_size} bytes, over the bound of {mib} MiB for a trace")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _lines(path: Path, f: Any) -> Iterator[TraceRequest]:
    first: float | None = None
    previous = 0.0
    number = total = 0
    while raw := f.readline(MAX_LINE_BYTES + 1):
        number += 1
        total += len(raw)
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(path, f"longer than {MAX_LINE_BYTES} bytes", number)
        if total > MAX_TRACE_BYTES:  # the file grew while it was read
            raise TraceError(path, f"over the bound of {MAX_TRACE_BYTES // 2**20} MiB", number)
        if not raw.strip():
            continue
        request = _request(path, raw, number)
        if first is None:
            first = request.timestamp_ms
        elif request.timestamp_ms < previous:
            problem = f"timestamp {request.timestamp_ms:g} is before the previous line's "
            raise TraceError(path, problem + f"{previous:g}: sort the trace by timestamp", number)
        if request.timestamp_ms - first > MAX_SPAN_MS:
            raise TraceError(path, f"more than {MAX_SPAN_MS} ms after the first line", number)
        previous = request.timestamp_ms
        yield request


def _request(path: Path, raw: bytes, number: int) -> TraceRequest:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        detail = " ".join(str(exc).split())[:120]
        raise TraceError(path, f"not JSON ({detail})", number) from None
    if not isinstance(data, dict):
        raise TraceError(path, f"expected a JSON object, got {type(data).__name__}", number)
    for key in ("timestamp", "input_length", "output_length"):
        if key not in data:
            raise TraceError(path, f'missing "{key}"', number)
    stamp = data["timestamp"]
    if not _number(stamp) or not 0 <= stamp < math.inf:
        raise TraceError(path, f"timestamp must be milliseconds >= 0, got {_show(stamp)}", number)
    lengths = [data["input_length"], data["output_length"]]
    for key, value in zip(("input_length", "output_length"), lengths, strict=True):
        if not _integer(value) or not 1 <= value <= MAX_TOKENS:
            raise TraceError(path, f"{key} must be 1..{MAX_TOKENS}, got {_show(value)}", number)
    ids = data.get("hash_ids", [])
    if not isinstance(ids, list) or len(ids) > MAX_HASH_IDS:
        problem = f"hash_ids must be a list of at most {MAX_HASH_IDS} ids"
        raise TraceError(path, problem, number)
    for value in ids:
        if not _integer(value) or not 0 <= value <= MAX_HASH_ID:
            raise TraceError(path, f"hash_ids hold 0..2^63-1, got {_show(value)}", number)
    return TraceRequest(float(stamp), lengths[0], lengths[1], tuple(ids), number)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    return " ".join(json.dumps(value).split())[:40]


@dataclass(slots=True)
class Pace:
    """The replay's bound on one pass: the requests due by t seconds into it (each line
    `rate_scale` requests, t = trace seconds since the pass's first line × `time_scale`) are at
    most `MAX_RATE` × t + `MAX_BURST`. Checked line by line, as the file streams."""

    path: Path
    time_scale: float = 1.0
    rate_scale: float = 1.0
    first_ms: float | None = None
    due: float = 0.0

    def check(self, request: TraceRequest) -> float:
        """Seconds from the pass's first line to `request`; `TraceError` past the bound."""
        if self.first_ms is None:
            self.first_ms = request.timestamp_ms
        at = (request.timestamp_ms - self.first_ms) / 1000 * self.time_scale
        self.due += self.rate_scale
        if self.due > MAX_RATE * at + MAX_BURST:
            problem = (
                f"{self.due:.0f} requests due {at:.3f} s into a pass, over the bound of "
                f"{MAX_RATE:.0f} requests/s and {MAX_BURST:.0f} at once"
            )
            raise TraceError(self.path, problem, request.line, reason="pace")
        return at


def check_trace(path: Path, *, time_scale: float = 1.0, rate_scale: float = 1.0) -> TraceSummary:
    """Read the whole trace once (at configuration time), paced as it will be replayed;
    `TraceError` names any fault."""
    count, first, last, inputs, outputs, shared = 0, 0.0, 0.0, 0, 0, False
    pace = Pace(path, time_scale, rate_scale)
    for request in read_trace(path):
        pace.check(request)
        if count == 0:
            first = request.timestamp_ms
        count += 1
        last = request.timestamp_ms
        inputs += request.input_length
        outputs += request.output_length
        shared = shared or bool(request.hash_ids)
    if count == 0:
        raise TraceError(path, "holds no requests", reason="empty")
    return TraceSummary(count, first, last, inputs / count, outputs / count, shared)


# -- the requests an open loop sends ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """One arrival: when (seconds from the run's start), how long, and any shared prefix."""

    offset: float
    prompt_tokens: int
    max_tokens: int
    prefix: SharedPrefix | None = None


@dataclass(frozen=True, slots=True)
class Replay:
    """How a trace is replayed (the validated `trace:` section, shard and seed applied)."""

    path: Path
    summary: TraceSummary
    time_scale: float = 1.0
    rate_scale: float = 1.0
    loop: bool = True
    block_tokens: int = 512
    seed: int | None = None
    shard: tuple[int, int] = (0, 1)  # (index, count): this replica sends lines i ≡ index

    @property
    def mean_rate(self) -> float:
        """Requests per second this replica sends, over a pass."""
        return self.summary.mean_rate / self.time_scale * self.rate_scale / self.shard[1]


def replay(spec: Replay) -> Iterator[Request]:
    """The trace's requests as offsets from its first line, scaled, copied or thinned, looped.
    Each pass reads the file again and checks it as the first was read (`Pace`); one that
    reads no request, or runs past the checked span while looping, is a `TraceError`."""
    rng = random.Random(spec.seed)
    whole, extra = divmod(spec.rate_scale, 1.0)
    period = spec.summary.period_seconds * spec.time_scale
    span = (spec.summary.last_ms - spec.summary.first_ms) / 1000 * spec.time_scale
    copies_most = int(whole) + (extra > 0)
    index, count = spec.shard
    sent = 0
    passes = 0
    while True:
        pace = Pace(spec.path, spec.time_scale, spec.rate_scale)
        for line in read_trace(spec.path):
            since_first = pace.check(line)
            if spec.loop and since_first > span * (1 + 1e-9):
                problem = f"runs {since_first:.3f} s into a pass, past the {span:.3f} s checked"
                raise TraceError(spec.path, problem, line.line, reason="changed")
            at = passes * period + since_first
            copies = int(whole) + (rng.random() < extra)
            for copy in range(copies):
                sent += 1
                if (sent - 1) % count != index:
                    continue
                tenant = passes * copies_most + copy
                yield Request(
                    at,
                    line.input_length,
                    line.output_length,
                    _prefix(line.hash_ids, tenant, spec.block_tokens),
                )
        if pace.first_ms is None:
            problem = "a pass of the replay read no request (the file is empty or blank now)"
            raise TraceError(spec.path, problem, reason="empty")
        if not spec.loop:
            return
        passes += 1


def _prefix(ids: tuple[int, ...], tenant: int, block_tokens: int) -> SharedPrefix | None:
    if not ids:
        return None
    return SharedPrefix(tuple(tenant << _ID_BITS | h for h in ids), block_tokens)
