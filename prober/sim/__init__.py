"""OpenAI-compatible LLM engine simulator: slots, prefill/decode cost, FIFO queue, KV budget,
reasoning channel, fault injection, and `/metrics` with the true queue depth.

Public API (wired by `prober.cli`):

- `SimConfig`: frozen, validated configuration;
- `build_app(cfg)`: the aiohttp application;
- `serve(cfg, host, port)`: start it, return the `AppRunner` (stop with `runner.cleanup()`);
  `bound_port(runner)` gives the port when `port` was 0;
- `add_sim_arguments(parser)` / `sim_config_from_args(ns)`: command-line flags.
"""

from prober.sim.app import bound_port, build_app, serve
from prober.sim.cli import add_sim_arguments, sim_config_from_args
from prober.sim.config import SimConfig

__all__ = [
    "SimConfig",
    "add_sim_arguments",
    "bound_port",
    "build_app",
    "serve",
    "sim_config_from_args",
]
