"""`dns`: A, AAAA or SRV records, polled with dnspython's asyncio resolver.

A and AAAA give `address:port` with the group's `port` (`[address]:port` for IPv6); SRV gives
each record's `target:port`, the target's name as the record holds it (Prometheus's dns_sd
does the same: the name is resolved when a probe connects). The query goes to `server` where
it is set, else to the system's resolver, whose configuration (`/etc/resolv.conf`) is read off
the event loop, once; relative names use its search list, as a pod's lookups do.

NXDOMAIN and an answer without records (NODATA) are answers: the name has no addresses now
(a headless Service whose pods are all gone), so the list is empty, and the targets leave
after `remove_after_seconds`, as Prometheus's dns_sd treats them; a blip of either is
outlived by that delay. A timeout, SERVFAIL, REFUSED or any other failure is a fault and
`found=None`: the group keeps its last good list.
"""

from __future__ import annotations

import asyncio

import dns.asyncresolver
import dns.exception
import dns.name
import dns.resolver
from dns.rdata import Rdata
from dns.rdtypes.IN.A import A
from dns.rdtypes.IN.AAAA import AAAA
from dns.rdtypes.IN.SRV import SRV

from prober.config.discovery import DnsConfig
from prober.discovery.source import MAX_TARGETS, Discovered, Fault, Fetched, Reason

LABEL = "dns_name"  # the name queried, a label a group may declare


def _resolver(config: DnsConfig) -> dns.asyncresolver.Resolver:
    """Reads /etc/resolv.conf without `server`: call it off the loop."""
    nameserver = config.nameserver
    if nameserver is None:
        resolver = dns.asyncresolver.Resolver()
    else:
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [nameserver[0]]
        resolver.port = nameserver[1]
    resolver.lifetime = config.timeout_seconds
    resolver.timeout = min(config.timeout_seconds, 2.0)  # one try; retried within lifetime
    return resolver


class DnsSd:
    """One group's DNS name."""

    def __init__(self, config: DnsConfig, declared: tuple[str, ...] | list[str]) -> None:
        self.config = config
        self.labels = ((LABEL, config.name[:128]),) if LABEL in declared else ()
        self._resolver: dns.asyncresolver.Resolver | None = None

    async def fetch(self) -> Fetched:
        name = self.config.name
        try:
            if self._resolver is None:
                self._resolver = await asyncio.to_thread(_resolver, self.config)
            answer = await self._resolver.resolve(name, self.config.type, search=True)
        except dns.resolver.NXDOMAIN:
            return Fetched((), empty_because="NXDOMAIN")
        except dns.resolver.NoAnswer:
            return Fetched((), empty_because="no records of the type")
        except dns.resolver.LifetimeTimeout:
            return Fetched(None, (Fault(Reason.TIMEOUT, f"{name}: no DNS answer in time"),))
        except (dns.exception.DNSException, OSError) as exc:
            detail = f"{name}: {type(exc).__name__}: {exc}"
            return Fetched(None, (Fault(Reason.DNS, detail),))
        found: dict[str, Discovered] = {}
        for record in answer:
            address = self._address(record)
            if address is not None and len(found) < MAX_TARGETS:
                found.setdefault(address, Discovered(address, self.labels))
        faults: tuple[Fault, ...] = ()
        if len(answer) > MAX_TARGETS:
            faults = (Fault(Reason.TOO_MANY, f"{name}: over {MAX_TARGETS} records"),)
        return Fetched(tuple(sorted(found.values(), key=lambda d: d.address)), faults)

    async def close(self) -> None:
        return None

    def _address(self, record: Rdata) -> str | None:
        if isinstance(record, SRV):
            if record.target == dns.name.root or not record.port:  # "no such service here"
                return None
            return f"{record.target.to_text(omit_final_dot=True)}:{record.port}"
        if isinstance(record, A):
            return f"{record.address}:{self.config.port}"
        if isinstance(record, AAAA):
            return f"[{record.address}]:{self.config.port}"
        return None
