"""`llm-prober bench`: one-shot sweeps of concurrency (closed loop) or request rate (open loop)
against an OpenAI-compatible server, reported as JSON, a table and charts.

Modules: `config` (validated `BenchConfig`), `runner` (sends through `Target.send` and
`LoadDriver`), `stats` (pure maths of a level: distributions, Little's law), `throughput`
(its rates), `intervals` (seeded bootstrap intervals), `verdicts` (knee, capacity, warnings,
judged on the intervals), `report` (JSON document), `text` (summary table and lines),
`watch` (was the client the bottleneck?), `progress` (live bars), `plots` (PNGs), `cli`
(flags).

Public API: `add_bench_parser(subparsers)` and `run_bench(args)` for the command line;
`measure(cfg)` (async) returns the report as a dict for library use and tests.
"""

from prober.bench.cli import add_bench_parser, config_from_args, measure, run_bench
from prober.bench.config import BenchConfig, Level, Mode

__all__ = [
    "BenchConfig",
    "Level",
    "Mode",
    "add_bench_parser",
    "config_from_args",
    "measure",
    "run_bench",
]
