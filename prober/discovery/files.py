"""`file_sd`: Prometheus's file_sd files, JSON or YAML, found by glob patterns.

Every file system call runs off the event loop (one `asyncio.to_thread` per scan): the globs,
a `stat` of each file, and the reads. A file is read again when its signature (inode, size,
modification time) changed, or when `refresh_interval_seconds` passed since it was read; a
read is refused before any byte unless the path is a regular file (`os.stat`, `S_ISREG`: a
FIFO or a device would block or never end) and at most `MAX_BYTES` long, and the file is
opened with `O_NONBLOCK` and checked again (`fstat`) in case it was swapped in between. A
file that cannot be read, is cut short (half written) or holds no target-group list keeps the
last good list it gave and counts a fault; a file no pattern matches any more gives nothing
(it was removed). `.json` files are parsed as JSON, others as YAML (which JSON also is).
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import yaml

from prober.config.discovery import FileSdConfig
from prober.discovery.source import (
    MAX_BYTES,
    MAX_TARGETS,
    Discovered,
    Fault,
    Fetched,
    Reason,
    parse_groups,
)

# Beyond this many files a group's patterns match, the rest are left out (and counted).
MAX_FILES = 256
Signature = tuple[int, int, int]  # inode, size, modification time (ns)


@dataclass(frozen=True, slots=True)
class _Read:
    """What one file gave when it was last read well."""

    signature: Signature
    digest: str
    found: tuple[Discovered, ...]
    at: float


class Refused(Exception):
    """A path that is not read: `reason` and why."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def read_bounded(path: str, limit: int = MAX_BYTES) -> tuple[Signature, bytes]:
    """The bytes of the regular file `path`, at most `limit`; `Refused` otherwise. Blocking:
    call it off the event loop."""
    try:
        before = os.stat(path)
        _check(before, path, limit)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            now = os.fstat(fd)
            _check(now, path, limit)
            chunks, size = [], 0
            while size <= limit and (chunk := os.read(fd, min(65536, limit + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        raise Refused(Reason.UNREADABLE, f"{path}: {exc.strerror or exc}") from None
    if size > limit:
        raise Refused(Reason.TOO_LARGE, f"{path}: over {limit} bytes")
    return _signature(now), b"".join(chunks)


def _check(st: os.stat_result, path: str, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise Refused(Reason.UNREADABLE, f"{path}: not a regular file")
    if st.st_size > limit:
        raise Refused(Reason.TOO_LARGE, f"{path}: {st.st_size} bytes, over {limit}")


def _signature(st: os.stat_result) -> Signature:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def parse_document(path: str, raw: bytes) -> object:
    """A file's data; ValueError where it is not UTF-8 JSON or YAML."""
    text = raw.decode("utf-8")
    if path.endswith(".json"):
        return json.loads(text)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(" ".join(str(exc).split())) from None


class FileSd:
    """A group's files: each one's last good list, read again when it changed."""

    def __init__(
        self,
        config: FileSdConfig,
        declared: Collection[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.declared = tuple(declared)
        self.clock = clock
        self._reads: dict[str, _Read] = {}

    async def fetch(self) -> Fetched:
        reads = dict(self._reads)
        now = self.clock()
        reads, faults = await asyncio.to_thread(self._scan, reads, now)
        self._reads = reads
        found: dict[str, Discovered] = {}
        for path in sorted(reads):  # an address in two files: the first file's labels
            for discovered in reads[path].found:
                found.setdefault(discovered.address, discovered)
        if len(found) > MAX_TARGETS:
            faults.append(Fault(Reason.TOO_MANY, f"over {MAX_TARGETS} addresses"))
        return Fetched(tuple(found.values())[:MAX_TARGETS], tuple(faults))

    async def close(self) -> None:
        return None

    def _scan(self, reads: dict[str, _Read], now: float) -> tuple[dict[str, _Read], list[Fault]]:
        """Off the loop: the files the patterns match now, each read if it changed or is due."""
        faults: list[Fault] = []
        paths = sorted({p for pattern in self.config.files for p in glob.glob(pattern)})
        if len(paths) > MAX_FILES:
            faults.append(Fault(Reason.TOO_MANY, f"over {MAX_FILES} files match"))
            paths = paths[:MAX_FILES]
        kept: dict[str, _Read] = {}
        for path in paths:
            last = reads.get(path)
            read: _Read | None
            try:
                read, problems = self._read(path, last, now)
                faults += problems
            except Refused as exc:
                faults.append(Fault(exc.reason, str(exc)))
                read = last  # the file's last good list, if it had one
            if read is not None:
                kept[path] = read
        return kept, faults

    def _read(self, path: str, last: _Read | None, now: float) -> tuple[_Read, list[Fault]]:
        """The file's list, read again where it changed or is due; `Refused` where it cannot
        be read or holds no target-group list (a half-written file among them)."""
        if last is not None and now - last.at < self.config.refresh_interval_seconds:
            try:
                if _signature(os.stat(path)) == last.signature:
                    return last, []  # unchanged, and not due
            except OSError as exc:
                raise Refused(Reason.UNREADABLE, f"{path}: {exc.strerror or exc}") from None
        signature, raw = read_bounded(path)
        digest = hashlib.sha256(raw).hexdigest()
        if last is not None and digest == last.digest:
            return _Read(signature, digest, last.found, now), []
        try:
            data = parse_document(path, raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise Refused(Reason.MALFORMED, f"{path}: {exc}") from None
        found, faults = parse_groups(data, self.declared, path)
        garbled = [f for f in faults if f.reason is Reason.MALFORMED]
        if garbled:  # a list cut short or mistyped: none of it is trusted
            raise Refused(Reason.MALFORMED, garbled[0].detail)
        return _Read(signature, digest, tuple(found), now), faults
