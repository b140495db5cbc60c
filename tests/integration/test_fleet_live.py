"""The fleet with real parts: `llm-prober run` processes, simulator processes, file_sd files
and dnsmasq, on loopback.

- SIGHUP on a running daemon whose file the test rewrites: a target added, one's interval
  changed, one removed; a bad file keeps the last good configuration and reads 0;
- replicas added to and removed from a file_sd file and a DNS name while background load
  runs: an added one warms up, then is probed; a removed one leaves `/metrics` after
  `remove_after_seconds` and the grace;
- three shards reading one file_sd file: every address probed by exactly one daemon, and
  again after one of them restarts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.dnsmasq import dnsmasq
from tests.support.fleet_live import Daemon, running, targets, total, until
from tests.support.probes_alone_accuracy import sim_process

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def sims() -> Iterator[list[str]]:
    """Three simulator processes; their base URLs."""
    with sim_process() as a, sim_process() as b, sim_process() as c:
        yield [a, b, c]


def target(base: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": f"{base}/v1", "model": "sim", "interval_seconds": 0.5,
            "warmup": 0, **extra}  # fmt: skip


def test_sighup_reloads_the_file_and_a_bad_one_changes_nothing(
    tmp_path: Path, sims: list[str]
) -> None:
    sim = sims[0]
    config = {"targets": [target(sim, "a"), target(sim, "b")]}
    with running(tmp_path, config) as daemon:
        until("a and b probed", lambda: targets(daemon.samples()) == {"a", "b"}, 30)
        daemon.write({"targets": [target(sim, "b", interval_seconds=2), target(sim, "c")]})
        daemon.sighup()

        def reloaded() -> bool:
            samples = daemon.samples()
            interval = total(samples, "llmprober_probe_interval_seconds", target="b")
            return targets(samples) == {"b", "c"} and interval == 2

        until("a gone, c probed, b's interval 2 s", reloaded, 30)
        samples = daemon.samples()
        assert total(samples, "llmprober_config_last_reload_successful") == 1
        b_before = total(samples, "llmprober_requests_total", target="b")
        daemon.write_text("targets: [{name: b, url: 'not a url'")  # cut short
        daemon.sighup()
        until(
            "the reload refused",
            lambda: total(daemon.samples(), "llmprober_config_last_reload_successful") == 0,
            15,
        )
        until(
            "b and c still probed",
            lambda: total(daemon.samples(), "llmprober_requests_total", target="b") > b_before,
            15,
        )
        assert targets(daemon.samples()) == {"b", "c"}
        assert daemon.events("reload_failed")


def _replica_group(name: str, source: dict[str, Any]) -> dict[str, Any]:
    return {
        "group": name, "model": "sim", "interval_seconds": 0.5, "warmup": 1,
        "remove_after_seconds": 1, "url": "http://{address}/v1", **source,
    }  # fmt: skip


def _address(base: str) -> str:
    return base.removeprefix("http://")


def test_replicas_come_and_go_through_file_sd_and_dns_under_load(
    tmp_path: Path, sims: list[str]
) -> None:
    file = tmp_path / "replicas.json"
    file.write_text(json.dumps([{"targets": [_address(sims[0])]}]))
    port = int(sims[1].rsplit(":", 1)[1])  # the DNS group: one name, the port fixed
    with dnsmasq(tmp_path, []) as dns:
        dns_source = {"dns": {"name": "llm.test", "type": "A", "port": port, "server": dns.server,
                              "refresh_interval_seconds": 0.5, "timeout_seconds": 1}}  # fmt: skip
        load = {"rate": 2.0, "max_in_flight": 4}
        config = {
            "targets": [target(sims[2], "background", load=load)],
            "target_groups": [
                _replica_group("files", {"file_sd": {"files": [str(file)]}, "load": load}),
                _replica_group("dns", dns_source),
            ],
        }
        with running(tmp_path, config) as daemon:
            first = f"files/{_address(sims[0])}"
            until("the file's replica probed", lambda: first in targets(daemon.samples()), 30)
            added = f"files/{_address(sims[1])}"
            file.write_text(json.dumps([{"targets": [_address(sims[0]), _address(sims[1])]}]))
            dns.hosts(["127.0.0.1 llm.test"])
            from_dns = f"dns/127.0.0.1:{port}"
            both = {first, added, from_dns, "background"}
            until("both added", lambda: targets(daemon.samples()) == both, 30)

            def warmed() -> bool:  # each warms up before its first probe
                return {added, from_dns} <= {r.get("target") for r in daemon.events("warmup")}

            until("the added ones warmed up", warmed, 15)
            file.write_text(json.dumps([{"targets": [_address(sims[1])]}]))
            dns.hosts([])  # NXDOMAIN: an empty answer
            samples = daemon.samples()
            assert {first, from_dns} <= targets(samples)  # still there: 1 s absent first
            assert total(samples, "llmprober_load_in_flight", target=first) >= 0
            # remove_after_seconds (1) + the file poll (5) + debounce (1) + grace (1)
            until(
                "both removed",
                lambda: targets(daemon.samples()) == {added, "background"},
                20,
            )
            samples = daemon.samples()
            assert not any(dict(labels).get("target") in (first, from_dns) for _, labels in samples)
            assert total(samples, "llmprober_requests_total", target="background") > 0


def test_three_shards_probe_every_address_once(tmp_path: Path, sims: list[str]) -> None:
    file = tmp_path / "fleet.json"
    port = int(sims[0].rsplit(":", 1)[1])
    # The split is a hash of each name, and the names carry the simulator's port, new each
    # run: with 12 names a shard held none in (2/3)^12 of runs for each of three shards
    # (2.3 %; seen once, a fresh run at fcfba20); with 24, 0.02 %.
    addresses = [f"127.0.0.{i}:{port}" for i in range(1, 25)]
    file.write_text(json.dumps([{"targets": addresses}]))
    group = {
        "group": "fleet", "model": "sim", "interval_seconds": 1, "warmup": 0,
        "url": f"http://127.0.0.1:{port}/v1", "file_sd": {"files": [str(file)]},
    }  # fmt: skip
    daemons = [
        Daemon(tmp_path, {"target_groups": [group], "shard": {"index": i, "count": 3}}, f"d{i}")
        for i in range(3)
    ]
    wanted = {f"fleet/{address}" for address in addresses}
    try:
        for daemon in daemons:
            daemon.start()

        def split_once() -> bool:
            held = [targets(d.samples()) for d in daemons]
            return sum(len(h) for h in held) == len(wanted) and set().union(*held) == wanted

        until("every address on exactly one shard", split_once, 40)
        held = [targets(d.samples()) for d in daemons]
        assert all(held)  # 24 names over 3 shards: each holds some
        daemons[1].stop()
        daemons[1].start()
        until("the same split after a restart", split_once, 40)
        assert [targets(d.samples()) for d in daemons] == held
        info = [targets(d.samples(), "llmprober_target_info") for d in daemons]
        assert info == held
    finally:
        for daemon in daemons:
            daemon.stop()
