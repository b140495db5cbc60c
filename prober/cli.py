"""`llm-prober` command line: run | probe | check-config | sim | demo | bench.

Settings are built here once and passed down. This is the one catch-all of the program:
a bad input prints one clear line and exits 2; nothing else escapes as a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from prober import __version__
from prober.config.flags import FLAG_NAMES, add_target_flags, target_flags
from prober.logs import get_logger, setup_logging
from prober.preflight import check_targets
from prober.request import DEFAULT_TIMEOUTS, Api
from prober.request.wire import client_session
from prober.settings import (
    ConfigError,
    FieldError,
    ServerConfig,
    Settings,
    TargetConfig,
    load_settings,
)
from prober.summary import result_summary
from prober.targets import Target
from prober.validation import bound, describe, field_path, wrong

EXIT_USAGE = 2


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(wrong("an integer", text)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(bound("at least", 1, value))
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(wrong("a number", text)) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(bound("greater than", 0, value))
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(wrong("a port number", text)) from None
    if not 0 <= value <= 65535:
        relation, limit = ("at least", 0) if value < 0 else ("at most", 65535)
        raise argparse.ArgumentTypeError(bound(relation, limit, value))
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm-prober", description=__doc__)
    parser.add_argument("--version", action="version", version=f"llm-prober {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the exporter daemon")
    run.add_argument("--config", type=Path, help="YAML file (environment LLMPROBER_* overrides)")

    check = sub.add_parser("check-config", help="validate a configuration file")
    check.add_argument("config", type=Path)
    check.add_argument(
        "--probe",
        action="store_true",
        help="also send each target one streamed one-token request: one line per target, "
        "ok or what to fix (exit 1 if any fails)",
    )

    probe = sub.add_parser("probe", help="send one streaming request and print the result")
    probe.add_argument("--url", required=True, help="OpenAI base URL, e.g. http://host:8080/v1")
    probe.add_argument("--model", required=True)
    probe.add_argument("--api", choices=[a.value for a in Api], default=Api.CHAT.value)
    probe.add_argument("--prompt-tokens", type=_positive_int, default=64)
    probe.add_argument("--max-tokens", type=_positive_int, default=16)
    probe.add_argument("--api-key-env", metavar="VAR", help="environment variable with the key")
    add_target_flags(probe)
    # One probe gives up where the daemon's would stop waiting for a first token.
    timeout = DEFAULT_TIMEOUTS.first_token_seconds
    probe.add_argument(
        "--timeout",
        type=_positive_float,
        default=timeout,
        help=f"first-token and total timeout, seconds (default {timeout:g})",
    )
    probe.add_argument("--json", action="store_true", help="print one JSON object")

    from prober.sim import add_sim_arguments

    sim = sub.add_parser("sim", help="run the engine simulator (OpenAI-compatible)")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8000)
    add_sim_arguments(sim)

    demo = sub.add_parser("demo", help="simulator + daemon together, metrics on a printed URL")
    demo.add_argument("--port", type=_port, default=9470, help="daemon port (default 9470)")
    demo.add_argument(
        "--sim-port", type=_port, default=0, help="simulator port (default: a free one, printed)"
    )
    demo.add_argument("--load-rate", type=float, default=2.0, help="background requests/s")

    from prober.bench import add_bench_parser

    add_bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(_dispatch(args))
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    command: str = args.command
    if command == "check-config":
        settings = load_settings(args.config)
        listen_addresses(settings.server)  # resolvable; only `run` can tell if it is free
        print(f"{args.config}: ok ({checked(settings)})")
        return asyncio.run(_check_targets(settings.targets)) if args.probe else 0
    if command == "run":
        return run_daemon(args.config)
    if command == "probe":
        return asyncio.run(_probe(args))
    if command == "sim":
        return _sim(args)
    if command == "demo":
        from prober.demo import run_demo

        return run_demo(args.port, args.sim_port, args.load_rate)
    if command == "bench":
        from prober.bench import run_bench

        return run_bench(args)
    raise AssertionError(f"unhandled command {command}")


def checked(settings: Settings) -> str:
    """What `check-config` checked: the targets, and the target groups where there are some
    (their targets are found at run time; each template was checked for a sample address)."""
    static = len(settings.targets)
    if not settings.target_groups:
        return f"{static} targets"
    return f"{static} static targets, {len(settings.target_groups)} target groups"


def run_daemon(config: Path | None) -> int:
    from prober.fleet.reload import ConfigSource
    from prober.runtime import favour_the_loop, new_event_loop, tune_gc
    from prober.web import RELOADER, WEB, build_app

    settings = load_settings(config)
    server = settings.server
    # Bind before anything starts: a port in use is a one-line error, before any probe.
    sockets = bind(server)
    setup_logging(settings.logging.format, settings.logging.level)
    log = get_logger("prober")
    loop, loop_name = new_event_loop(server.event_loop)
    asyncio.set_event_loop(loop)
    _stop_on_signals(loop, log, server.grace_seconds)
    app = build_app(settings, source=ConfigSource(config))
    # SIGHUP reloads the configuration (validated first; a bad one changes nothing).
    loop.add_signal_handler(signal.SIGHUP, app[RELOADER].trigger, "sighup")
    web_config = app[WEB].config
    tune_gc()  # after start-up allocated its long-lived objects
    favour_the_loop()  # a render in its worker thread holds the loop back less
    log.info(
        "starting",
        version=__version__,
        listen=server.listen,
        targets=len(settings.targets),
        target_groups=len(settings.target_groups),
        tls=web_config.tls,
        basic_auth=bool(web_config.users),
        event_loop=loop_name,
    )
    web.run_app(
        app,
        loop=loop,
        sock=sockets,
        ssl_context=app[WEB].ssl_context,  # the one a reload loads new TLS files into
        print=None,
        access_log=None,
        shutdown_timeout=server.grace_seconds,
        handler_cancellation=True,
        handle_signals=False,  # ours (`_stop_on_signals`): one drain, whatever follows
    )
    # Closing the loop restored the default handlers: a signal from here on is ignored too.
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    log.info("stopped")
    return 0


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _stop_on_signals(loop: asyncio.AbstractEventLoop, log: Any, grace_seconds: float) -> None:
    """SIGTERM or SIGINT starts the one drain; any later one, in any order, is only logged.

    aiohttp's own handlers raise `GracefulExit` on every signal: a second one during the
    drain raised it again inside the jobs being drained (exit 1, two tracebacks)."""
    stopping = False

    def on_signal(signum: signal.Signals) -> None:
        nonlocal stopping
        if stopping:
            log.info("stop_signal_ignored", signal=signum.name, note="already draining")
            return
        stopping = True
        log.info("stop_signal", signal=signum.name, grace_seconds=grace_seconds)
        raise web.GracefulExit

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)


def listen_addresses(server: ServerConfig) -> list[tuple[Any, ...]]:
    """`server.listen` resolved, one (family, type, proto, address) per address; ConfigError."""
    host = server.host or None
    try:
        infos = socket.getaddrinfo(
            host, server.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "invalid host name"
        raise ConfigError([f"server.listen: cannot resolve {server.host!r}: {reason}"]) from None
    unique = {(family, kind, proto, address) for family, kind, proto, _, address in infos}
    return sorted(unique, key=repr)


def bind(server: ServerConfig) -> list[socket.socket]:
    """Listening sockets on every address of `server.listen`, or ConfigError naming it."""
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, address in listen_addresses(server):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio does: v4 and v6 bind separately
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(128)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        problem = f"server.listen: cannot listen on {server.listen}: {exc.strerror or exc}"
        raise ConfigError([problem]) from None
    return sockets


def _sim(args: argparse.Namespace) -> int:
    from prober.sim import build_app as build_sim
    from prober.sim import sim_config_from_args

    try:
        cfg = sim_config_from_args(args)
    except ValueError as exc:
        print(f"sim: {exc}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging("auto", "info")
    print(f"simulator: http://{args.host}:{args.port}/v1 (model {cfg.model})", flush=True)
    web.run_app(build_sim(cfg), host=args.host, port=args.port, print=None, access_log=None)
    return 0


# A `probe` flag for each target field it sets: a fault names the flag the user typed.
_PROBE_FLAGS = {
    "url": "--url",
    "model": "--model",
    "api": "--api",
    "prompt_tokens": "--prompt-tokens",
    "max_tokens": "--max-tokens",
    "timeouts.first_token_seconds": "--timeout",
    "timeouts.total_seconds": "--timeout",
    **FLAG_NAMES,  # --api-key-env, --header, --api-key-header, --ca-file
}


def probe_target(args: argparse.Namespace) -> Target:
    """The target `probe` sends to, validated as a configured one is (URL, timeouts, TLS, API
    key): `probe`, `run` and `bench` build their targets the same way, by
    `Target.from_config`. A fault is a `ConfigError` naming the flag."""
    fields = {
        "name": "probe",
        "url": args.url,
        "model": args.model,
        "api": args.api,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "api_key_env": args.api_key_env,
        "timeouts": {"first_token_seconds": args.timeout, "total_seconds": args.timeout},
    }
    try:
        fields |= target_flags(args).fields()
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    try:
        cfg = TargetConfig.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = field_path(err["loc"])
        raise ConfigError([f"{_PROBE_FLAGS.get(where, where)}: {describe(err)}"]) from None
    try:
        return Target.from_config(cfg)
    except FieldError as exc:  # the key's faults name the field: name the flag
        raise FieldError(_PROBE_FLAGS.get(exc.field, exc.field), exc.message) from None


async def _check_targets(targets: list[TargetConfig]) -> int:
    """`check-config --probe`: one line per target, exit 1 when any failed."""
    setup_logging("auto", "error", stream=sys.stderr)
    lines = await check_targets(targets)
    for _, line in lines:
        print(line, flush=True)
    return 0 if all(ok for ok, _ in lines) else 1


async def _probe(args: argparse.Namespace) -> int:
    # The result says what the daemon's warnings would (its token source, say): stdout is the
    # result alone, stderr only an error.
    setup_logging("auto", "error", stream=sys.stderr)
    target = probe_target(args)
    async with client_session() as session:
        result = await target.send(session, time.perf_counter_ns())
    summary = result_summary(result)
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            if key != "itl_seconds":
                print(f"{key:>18}: {value}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
