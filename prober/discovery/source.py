"""What every discovery source answers, and Prometheus's target-group list read from it.

A source (`files.FileSd`, `http.HttpSd`, `dns.DnsSd`) is a `Source`: `fetch()` returns a
`Fetched`, the addresses it found now with their labels, or `found=None` where it could not
tell (the caller keeps the last good list), and the faults met on the way, each a `Fault` of a
closed `Reason` (the `reason` label of `llmprober_discovery_errors_total`). A fault is data:
no source raises for what a file, a server or a DNS answer holds.

`parse_groups` reads the list that file_sd files and HTTP SD answers hold
(`[{targets: ["host:port", ...], labels: {name: value}}]`): every address checked
(`prober.config.discovery.split_address`), only the label names the group declares kept,
their values cut to `MAX_LABEL_CHARS` printable characters, at most `MAX_TARGETS` addresses.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from prober.config.discovery import split_address

# Per group: more would be a fleet no prober replica should probe alone.
MAX_TARGETS = 4096
MAX_LABEL_CHARS = 128
# A file or an HTTP SD body: larger is refused before it is parsed.
MAX_BYTES = 4 * 1024 * 1024
_DETAIL_CHARS = 200

Labels = tuple[tuple[str, str], ...]


class Reason(StrEnum):
    """Why a refresh, or a part of it, failed: the closed set of the errors' `reason`."""

    UNREADABLE = "unreadable"  # missing, no permission, not a regular file (a FIFO, a device)
    TOO_LARGE = "too_large"  # over MAX_BYTES
    MALFORMED = "malformed"  # not JSON or YAML, not the list of target groups, wrong type
    INVALID_TARGET = "invalid_target"  # an address or the target made from it was refused
    TOO_MANY = "too_many"  # over MAX_TARGETS addresses: the rest were left out
    HTTP_STATUS = "http_status"  # an answer other than 200
    CONNECT = "connect"  # no connection, TLS refused, the connection broke
    TIMEOUT = "timeout"
    DNS = "dns"  # SERVFAIL, REFUSED or another DNS failure (NXDOMAIN is an empty answer)


@dataclass(frozen=True, slots=True)
class Discovered:
    """One address a source found, with the declared labels it came with."""

    address: str
    labels: Labels = ()


@dataclass(frozen=True, slots=True)
class Fault:
    reason: Reason
    detail: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", clean(self.detail, _DETAIL_CHARS))


@dataclass(frozen=True, slots=True)
class Fetched:
    """A source's answer: `found` None where it could not tell (keep the last good list)."""

    found: tuple[Discovered, ...] | None
    faults: tuple[Fault, ...] = ()
    # Why an answer was empty where the source says why (NXDOMAIN, NODATA): for the log.
    empty_because: str = field(default="")


class Source(Protocol):
    """A discovery source of one group."""

    async def fetch(self) -> Fetched: ...

    async def close(self) -> None: ...


def clean(text: str, limit: int) -> str:
    """`text` as one printable line of at most `limit` characters (hostile text bounded)."""
    cut = text[: limit * 4]
    return "".join(c if c.isprintable() else "?" for c in cut)[:limit]


def parse_groups(
    data: Any, declared: Collection[str], where: str
) -> tuple[list[Discovered], list[Fault]]:
    """The addresses of a target-group list (`where` names its origin in faults)."""
    if not isinstance(data, list):
        kind = type(data).__name__
        return [], [Fault(Reason.MALFORMED, f"{where}: a list of target groups, got a {kind}")]
    found: dict[str, Discovered] = {}
    faults: list[Fault] = []
    for index, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("targets", []), list):
            detail = f"{where}[{index}]: a mapping with a targets list"
            faults.append(Fault(Reason.MALFORMED, detail))
            continue
        labels, fault = _labels(entry.get("labels") or {}, declared, f"{where}[{index}]")
        faults += fault
        for address in _addresses(entry.get("targets") or [], f"{where}[{index}]", faults):
            if address in found:
                continue
            if len(found) >= MAX_TARGETS:
                faults.append(Fault(Reason.TOO_MANY, f"{where}: over {MAX_TARGETS} addresses"))
                return list(found.values()), faults
            found[address] = Discovered(address, labels)
    return list(found.values()), faults


def _addresses(items: Iterable[Any], where: str, faults: list[Fault]) -> Iterable[str]:
    bad = 0
    for item in items:
        try:
            if not isinstance(item, str):
                raise ValueError(type(item).__name__)
            split_address(item)
        except ValueError:
            bad += 1
            if bad == 1:  # one line for a list of bad addresses, not one each
                faults.append(Fault(Reason.INVALID_TARGET, f"{where}: not host:port: {item!r}"))
            continue
        yield item


def _labels(raw: Any, declared: Collection[str], where: str) -> tuple[Labels, list[Fault]]:
    """The declared labels of an entry, values bounded; a fault where `labels` is no mapping
    of text (a declared label that is absent is simply absent)."""
    if not isinstance(raw, dict):
        return (), [Fault(Reason.MALFORMED, f"{where}.labels: a mapping of label names to text")]
    kept = []
    for name in declared:
        value = raw.get(name)
        if isinstance(value, str):
            kept.append((name, clean(value, MAX_LABEL_CHARS)))
        elif value is not None:
            return (), [Fault(Reason.MALFORMED, f"{where}.labels.{name}: a string")]
    return tuple(sorted(kept)), []
