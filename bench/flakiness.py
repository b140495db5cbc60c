"""How often each accuracy and timing test passes, and how close it comes to its bounds.

Runs each group of tests K times (one pytest process per group and run, `CI=true` so a
missing engine fails instead of skipping), and prints, per test, its pass rate and, per
quantity it checks with `tests/support/margins.holds`, the worst margin seen: the distance to
the bound as a share of the bound's scale (0.25: a quarter to spare; negative: a miss).

    .venv/bin/python bench/flakiness.py                     # every group, 5 runs (~2.5 h)
    .venv/bin/python bench/flakiness.py --groups saturation,queue-sim --runs 3
    .venv/bin/python bench/flakiness.py --list

Needs what `./scripts/test` set up (the engines, vLLM and Prometheus in the cache). Results
with their date and commit go to docs/flakiness.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GROUPS: dict[str, list[str]] = {
    "saturation": ["tests/integration/test_saturation.py"],
    "queue-sim": [
        "tests/integration/test_queue_estimate_sim.py",
        "tests/integration/test_queue_probes_alone_sim.py",
    ],
    "queue-llama": [
        "tests/integration/test_queue_estimate_engine.py",
        "tests/integration/test_queue_probes_alone_engine.py",
    ],
    "llama": ["tests/integration/test_engine.py", "tests/integration/test_probe_phases.py"],
    "bench": ["tests/integration/test_bench_sim.py", "tests/integration/test_bench_engine.py"],
    "autoscale": ["tests/integration/test_autoscale.py"],
    "vllm": ["tests/vllm"],
}


def run_group(paths: list[str], margins: Path, junit: Path, log: Path) -> float:
    """One pytest run of `paths`, its output in `log`; its wall seconds."""
    env = {**os.environ, "CI": "true", "PROBER_TEST_MARGINS": str(margins)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "--tb=short",
           f"--junitxml={junit}", *paths]  # fmt: skip
    start = time.monotonic()
    with log.open("w") as out:
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    return time.monotonic() - start


def outcomes(junit: Path) -> dict[str, bool]:
    """test id → passed, from one run's JUnit XML (skipped tests left out)."""
    if not junit.exists():
        return {}
    found: dict[str, bool] = {}
    for case in ET.parse(junit).iter("testcase"):
        if case.find("skipped") is not None:
            continue
        module = case.get("classname", "").replace(".", "/")
        test = f"{module}.py::{case.get('name')}"
        found[test] = case.find("failure") is None and case.find("error") is None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", default=",".join(GROUPS), help="comma-separated groups")
    parser.add_argument("--runs", type=int, default=5, help="runs of each group (default 5)")
    parser.add_argument("--list", action="store_true", help="print the groups and exit")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument(
        "--logs", type=Path, help="keep each run's pytest output here (default: a new folder)"
    )
    args = parser.parse_args()
    if args.list:
        for name, paths in GROUPS.items():
            print(f"{name:12} {' '.join(paths)}")
        return
    chosen = [g.strip() for g in args.groups.split(",") if g.strip()]
    if unknown := [g for g in chosen if g not in GROUPS]:
        parser.error(f"--groups: unknown {', '.join(unknown)}; known: {', '.join(GROUPS)}")
    passes: dict[str, list[bool]] = defaultdict(list)
    worst: dict[tuple[str, str], dict[str, float | None]] = {}
    logs = args.logs or Path(tempfile.mkdtemp(prefix="llmprober-flakiness-"))
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        margins = Path(tmp) / "margins.jsonl"
        for group in chosen:
            for k in range(args.runs):
                junit = Path(tmp) / f"{group}-{k}.xml"
                log = logs / f"{group}-{k + 1}.log"
                seconds = run_group(GROUPS[group], margins, junit, log)
                seen = outcomes(junit)
                for test, ok in seen.items():
                    passes[test].append(ok)
                failed = sum(not ok for ok in seen.values())
                where = f" (see {log})" if failed else ""
                print(f"{group} run {k + 1}/{args.runs}: {len(seen)} tests, {failed} failed, "
                      f"{seconds:.0f} s{where}", flush=True)  # fmt: skip
        for line in margins.read_text().splitlines() if margins.exists() else []:
            row = json.loads(line)
            key = (row["test"], row["check"])
            margin = row["margin"] if row["margin"] is not None else -float("inf")
            if key not in worst or margin < (worst[key]["margin"] or -float("inf")):
                worst[key] = {**row, "margin": margin}
    report(passes, worst)
    if args.json:
        args.json.write_text(json.dumps({"passes": passes, "worst": list(worst.values())}))


def report(
    passes: dict[str, list[bool]], worst: dict[tuple[str, str], dict[str, float | None]]
) -> None:
    print("\n| test | passed | check | worst observed | bound | worst margin |")
    print("|---|---|---|---|---|---|")
    for test in sorted(passes):
        runs = passes[test]
        checks = sorted((c, r) for (t, c), r in worst.items() if t == test)
        rate = f"{sum(runs)}/{len(runs)}"
        if not checks:
            print(f"| {test} | {rate} | (no recorded bound) | | | |")
        for check, row in checks:
            bound = " ".join(
                f"{s} {row[k]:g}" for s, k in (("≥", "at_least"), ("≤", "at_most"))
                if row[k] is not None
            )  # fmt: skip
            observed = "nan" if row["observed"] is None else f"{row['observed']:.4g}"
            margin = row["margin"]
            assert margin is not None
            print(f"| {test} | {rate} | {check} | {observed} | {bound} | {margin:+.2f} |")


if __name__ == "__main__":
    main()
