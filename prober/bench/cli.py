"""`llm-prober bench`: its flags, their translation into a `BenchConfig`, and the run itself.

Flags are read as text and checked by `BenchConfig`, so a bad value prints exactly one line
naming the flag and exits 2. A flag that stands for a section of the daemon's load
(`--input-len`, `--output-len`, `--schedule`, `--trace`) takes what the configuration file
would hold there, as YAML: `--input-len 128`, `--input-len '{dist: lognormal, median: 512,
sigma: 1, max: 8192}'`, `--trace builtin:diurnal`. An unreachable or failing server is
caught by the pre-flight request and exits 1 within the connect timeout. Exit 0 when the
sweep ran, whatever the server's errors (they are data, in the report).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import sys
from pathlib import Path
from typing import Any

import yaml

from prober.bench.config import FLAGS, BenchConfig, Mode, parse_levels
from prober.bench.runner import BenchRunner, PreflightError
from prober.config.flags import add_target_flags, target_flags
from prober.kinds import ARRIVALS, EVENT_LOOPS, Api
from prober.request import BENCH_CONNECT_SECONDS, DEFAULT_TIMEOUTS
from prober.runtime import LoopUnavailable, new_event_loop, tune_gc
from prober.settings import ConfigError, FieldError
from prober.validation import wrong

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# flag, dest, metavar, help: read as text, converted and checked in `config_from_args`.
_VALUES: tuple[tuple[str, str, str], ...] = (
    ("--num-requests", "N", "measured requests per level (default 32 unless --duration)"),
    ("--duration", "S", "seconds of load per level instead of a request count"),
    (
        "--input-len",
        "TOKENS",
        "prompt length in tokens, calibrated (default 128), or a "
        "distribution as YAML: '{dist: lognormal, median: 512, sigma: 1, max: 8192}'",
    ),
    ("--output-len", "TOKENS", "max_tokens of every request (default 64), or a distribution"),
    ("--burstiness", "K", "--arrival gamma: the gaps' shape (1 = Poisson, < 1 burstier)"),
    (
        "--schedule",
        "YAML",
        "open loop: rate steps, scaled to each level's mean rate: "
        "'{steps: [{seconds: 30, rate: 1}, {seconds: 10, rate: 4}]}'",
    ),
    (
        "--trace",
        "FILE",
        "open loop: replay a JSONL trace (or builtin:diurnal), its time "
        "scaled to each level's mean rate; or YAML: '{path: FILE, loop: false}'",
    ),
    ("--warmup", "N", "unmeasured requests before each level (default 2)"),
    ("--seed", "N", "seed of the arrivals (default: random, recorded in the report)"),
    ("--slo-ttft", "S", "goodput SLO on TTFT, seconds (default 2.0)"),
    ("--slo-tpot", "S", "goodput SLO on TPOT, seconds (default 0.2)"),
    ("--slo-e2e", "S", "goodput SLO on E2E, seconds (default none)"),
    ("--capacity-goodput", "RATIO", "goodput ratio a level needs to count as capacity (0.9)"),
    ("--target-rate", "R", "req/s to size slots for: R x mean E2E at capacity"),
    (
        "--timeout",
        "S",
        f"per-request first-token and total timeout (default {DEFAULT_TIMEOUTS.total_seconds:g})",
    ),
    (
        "--connect-timeout",
        "S",
        f"connect timeout, also of the pre-flight (default {BENCH_CONNECT_SECONDS:g})",
    ),
    ("--max-in-flight", "N", "open loop: arrivals beyond this many in flight are dropped (1000)"),
)


def add_bench_parser(subparsers: Any) -> None:
    """Add the `bench` subcommand to `subparsers` (from `ArgumentParser.add_subparsers`)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="sweep concurrency or request rate; report latency, throughput, knee, capacity",
        description="Sweep concurrency (closed loop) or request rate (open loop) against one "
        "OpenAI-compatible server; report latency percentiles, throughput, goodput, a "
        "Little's law check, the knee and the capacity (docs/bench.md).",
    )
    p.add_argument("--url", required=True, help="OpenAI base URL, e.g. http://host:8080/v1")
    p.add_argument("--model", required=True)
    p.add_argument(
        "--api",
        choices=[a.value for a in Api],
        default="chat",
        help="chat, completions, or ollama (native /api/chat, NDJSON)",
    )
    p.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        default=Mode.CONCURRENCY.value,
        help="concurrency: closed loop; rate: open loop (Poisson)",
    )
    p.add_argument(
        "--concurrency",
        metavar="C,C,...",
        default="1,2,4,8",
        help="closed-loop levels (default 1,2,4,8)",
    )
    p.add_argument("--levels", metavar="R,R,...", help="open-loop rates in req/s (--mode rate)")
    p.add_argument("--arrival", choices=ARRIVALS, help="open-loop gaps (default poisson)")
    for flag, metavar, text in _VALUES:
        p.add_argument(flag, metavar=metavar, help=text)
    p.add_argument(
        "--no-cache-bust",
        action="store_true",
        help="send one identical prompt (shows what a prefix cache saves)",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="send ignore_eos: true, for exactly --output-len tokens",
    )
    p.add_argument("--api-key-env", metavar="VAR", help="environment variable with the API key")
    add_target_flags(p)  # --header, --api-key-header, --ca-file: as `probe` takes them
    p.add_argument("--out", metavar="FILE.json", type=Path, help="write the JSON report here")
    p.add_argument("--plot", metavar="DIR", type=Path, help="write PNG charts here")
    p.add_argument("--no-progress", action="store_true", help="no live progress bars")
    p.add_argument(
        "--emit-keda",
        metavar="FILE.yaml",
        type=Path,
        help="write a KEDA ScaledObject with budgets derived from the capacity "
        "(docs/autoscaling.md)",
    )
    p.add_argument(
        "--emit-hpa",
        metavar="FILE.yaml",
        type=Path,
        help="write the same targets as an autoscaling/v2 HPA (prometheus-adapter)",
    )
    p.add_argument(
        "--slots",
        metavar="N",
        type=int,
        help="the replica's parallel sequences, for the emitted budgets",
    )
    p.add_argument(
        "--scale-name",
        metavar="NAME",
        default="vllm",
        type=_kube_name,
        help="Deployment and prober target name in the emitted objects (default vllm)",
    )
    p.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default="auto",
        help="the client's loop, as the daemon's server.event_loop (auto: uvloop when installed)",
    )


def _number(args: argparse.Namespace, flag: str, kind: type[int] | type[float]) -> Any:
    raw = getattr(args, flag.removeprefix("--").replace("-", "_"), None)
    if raw is None:
        return None
    try:
        return kind(raw)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise ValueError(f"{flag}: {wrong(noun, raw)}") from None


def _yaml(args: argparse.Namespace, flag: str) -> Any:
    raw = getattr(args, flag.removeprefix("--").replace("-", "_"), None)
    if raw is None:
        return None
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ValueError(f"{flag}: not YAML ({problem}): {raw!r}") from None


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Flags → a validated `BenchConfig`; `ValueError('--flag: ...')` on the first fault."""
    mode = Mode(args.mode)
    if mode is Mode.RATE:
        if not args.levels:
            raise ValueError("--levels: required with --mode rate (e.g. --levels 1,2,4)")
        levels = parse_levels("--levels", args.levels, integers=False)
    else:
        levels = parse_levels("--concurrency", args.concurrency, integers=True)
    duration = _number(args, "--duration", float)
    count = _number(args, "--num-requests", int)
    seed = _number(args, "--seed", int)
    given: dict[str, Any] = {
        "input_len": _yaml(args, "--input-len"),
        "output_len": _yaml(args, "--output-len"),
        "burstiness": _number(args, "--burstiness", float),
        "schedule": _yaml(args, "--schedule"),
        "trace": _yaml(args, "--trace"),
        "arrival": args.arrival,
        "warmup": _number(args, "--warmup", int),
        "slo_ttft_seconds": _number(args, "--slo-ttft", float),
        "slo_tpot_seconds": _number(args, "--slo-tpot", float),
        "slo_e2e_seconds": _number(args, "--slo-e2e", float),
        "capacity_goodput": _number(args, "--capacity-goodput", float),
        "target_rate": _number(args, "--target-rate", float),
        "timeout_seconds": _number(args, "--timeout", float),
        "connect_timeout_seconds": _number(args, "--connect-timeout", float),
        "max_in_flight": _number(args, "--max-in-flight", int),
    }
    flags = target_flags(args)
    return BenchConfig(
        url=args.url,
        model=args.model,
        mode=mode,
        levels=levels,
        num_requests=count if count is not None or duration is not None else 32,
        duration_seconds=duration,
        cache_bust=not args.no_cache_bust,
        seed=seed if seed is not None else random.SystemRandom().randrange(2**31),
        api=Api(args.api),
        ignore_eos=args.ignore_eos,
        api_key_env=args.api_key_env,
        headers=dict(flags.headers),
        api_key_header=flags.api_key_header,
        ca_file=flags.ca_file,
        event_loop=getattr(args, "event_loop", "auto"),
        **{k: v for k, v in given.items() if v is not None},
    )


def run_bench(args: argparse.Namespace) -> int:
    """Run the sweep the flags describe; print the summary; write --out and --plot."""
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"llm-prober bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        print(
            "llm-prober bench: error: --plot needs matplotlib: pip install 'llm-prober[bench]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        doc = _run_on_runtime(cfg, progress=not args.no_progress)
    except LoopUnavailable as exc:
        print(f"llm-prober bench: error: --event-loop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FieldError as exc:  # the key's variable holds no usable key: name the flag
        flag = FLAGS.get(exc.field, exc.field)
        print(f"llm-prober bench: error: {flag}: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:
        print(f"llm-prober bench: error: {exc.problems[0]}", file=sys.stderr)
        return EXIT_USAGE
    except PreflightError as exc:
        print(f"llm-prober bench: {exc}", file=sys.stderr)
        return EXIT_FAILED
    from prober.bench.report import write_json
    from prober.bench.text import print_summary

    print_summary(doc)
    if args.out is not None:
        write_json(doc, args.out)
        print(f"report: {args.out}", file=sys.stderr)
    if args.plot is not None:
        from prober.bench.plots import write_plots

        for path in write_plots(doc, args.plot):
            print(f"plot: {path}", file=sys.stderr)
    return _emit(args, doc)


def _kube_name(value: str) -> str:
    from prober.bench.keda import kube_name

    try:
        return kube_name(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _emit(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    """Write --emit-keda / --emit-hpa; exit 1 when the report cannot size a replica."""
    keda_out, hpa_out = getattr(args, "emit_keda", None), getattr(args, "emit_hpa", None)
    if keda_out is None and hpa_out is None:
        return EXIT_OK
    import yaml

    from prober.bench.keda import derive, header, hpa, scaled_object

    try:
        budgets = derive(doc, getattr(args, "slots", None))
    except ValueError as exc:
        print(f"llm-prober bench: cannot derive autoscaling targets: {exc}", file=sys.stderr)
        return EXIT_FAILED
    name = getattr(args, "scale_name", "vllm")
    objects: list[tuple[Path, dict[str, Any]]] = []
    if keda_out is not None:
        objects.append((keda_out, scaled_object(budgets, name=name, target=name)))
    if hpa_out is not None:
        objects.append((hpa_out, hpa(budgets, name=name, target=name)))
    for path, obj in objects:
        path.write_text(header(budgets) + yaml.safe_dump(obj, sort_keys=False))
        print(f"autoscaling: {path}", file=sys.stderr)
    return EXIT_OK


def _run_on_runtime(cfg: BenchConfig, *, progress: bool) -> dict[str, Any]:
    """The sweep on the daemon's runtime (`prober/runtime.py`): its event loop (uvloop when
    installed) and its GC tuning, applied once start-up has allocated its long-lived objects
    and again before every level's clock. A bench on another loop than the daemon's would
    measure another client."""
    loop, loop_name = new_event_loop(cfg.event_loop)
    tune_gc()
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        return runner.run(measure(cfg, progress=progress, event_loop=loop_name, freeze_heap=True))


async def measure(
    cfg: BenchConfig, *, progress: bool = False, event_loop: str = "", freeze_heap: bool = False
) -> dict[str, Any]:
    """The library entry point: run the sweep on the running loop, return the JSON report.

    `event_loop` names that loop in the report (default: its class); `freeze_heap` applies
    the GC freeze before each level (the command line does; a library caller may not want
    its heap frozen)."""
    from prober.bench.progress import SweepProgress
    from prober.bench.report import build_report

    name = event_loop or _loop_name(asyncio.get_running_loop())
    with SweepProgress(enabled=progress) as bar:
        runner = BenchRunner(
            cfg,
            on_result=bar.on_result,
            on_phase=bar.on_phase,
            event_loop=name,
            freeze_heap=freeze_heap,
        )
        sweep = await runner.run()
    return build_report(cfg, sweep)


def _loop_name(loop: asyncio.AbstractEventLoop) -> str:
    module = type(loop).__module__.split(".")[0]
    return "uvloop" if module == "uvloop" else "asyncio"
