"""The flags `probe` and `bench` share to send as a configured target does: `--header 'NAME:
VALUE'` (repeatable, a target's `headers:`), `--api-key-header NAME` (`api_key_header`) and
`--ca-file PATH` (`tls.ca_file`).

`add_target_flags` adds them to a command's parser; `target_flags` reads them into a
`TargetFlags`, whose `fields()` are the `TargetConfig` fields they set, checked there as a
configured target's are. `TARGET_FLAGS` names the flag behind each such field, so a fault
names what the user typed (`--ca-file: no such file: x.pem`). A header's value is never
echoed in a fault, nor recorded (bench's report keeps the names): it may be a credential.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prober.validation import field_path

# The flag behind each target field these flags set, by the field's location in a fault.
TARGET_FLAGS: dict[tuple[int | str, ...], str] = {
    ("headers",): "--header",
    ("api_key_header",): "--api-key-header",
    ("tls", "ca_file"): "--ca-file",
}
# The same by the field's path, with the key's variable both commands take: how a message
# about a target's field names it to the user of `probe` or `bench`.
FLAG_NAMES = {"api_key_env": "--api-key-env"} | {
    field_path(loc): flag for loc, flag in TARGET_FLAGS.items()
}


@dataclass(frozen=True, slots=True)
class TargetFlags:
    """What the shared flags gave (bench keeps them as fields of its config)."""

    headers: Mapping[str, str] = field(default_factory=dict)
    api_key_header: str | None = None
    ca_file: Path | None = None

    def fields(self) -> dict[str, Any]:
        """The `TargetConfig` fields given, and only those (a default stays the target's)."""
        fields: dict[str, Any] = {}
        if self.headers:
            fields["headers"] = dict(self.headers)
        if self.api_key_header is not None:
            fields["api_key_header"] = self.api_key_header
        if self.ca_file is not None:
            fields["tls"] = {"ca_file": self.ca_file}
        return fields


def add_target_flags(parser: argparse.ArgumentParser) -> None:
    """`--header`, `--api-key-header` and `--ca-file` on `parser`."""
    parser.add_argument(
        "--header",
        action="append",
        metavar="'NAME: VALUE'",
        help="a request header, as a target's headers: (repeatable)",
    )
    parser.add_argument(
        "--api-key-header",
        metavar="NAME",
        help="the header --api-key-env's key goes in (default Authorization, as Bearer KEY; "
        "any other: the key alone, e.g. api-key for Azure OpenAI)",
    )
    parser.add_argument(
        "--ca-file",
        type=Path,
        metavar="PATH",
        help="PEM bundle to verify the server's certificate with, as a target's tls.ca_file",
    )


def target_flags(args: argparse.Namespace) -> TargetFlags:
    """The shared flags of `args`; `ValueError('--header: ...')` for a header that is not
    `NAME: VALUE` or is given twice. Its value is never echoed: it may be a credential."""
    headers: dict[str, str] = {}
    for text in args.header or []:
        name, colon, value = text.partition(":")
        name = name.strip()
        if not colon or not name:
            raise ValueError("--header: must be 'NAME: VALUE' (not shown: it may hold a key)")
        if name.lower() in {n.lower() for n in headers}:
            raise ValueError(f"--header: {name!r} is given twice")
        headers[name] = value.strip()
    return TargetFlags(headers=headers, api_key_header=args.api_key_header, ca_file=args.ca_file)
