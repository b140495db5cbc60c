"""Background load: open-loop requests beside the probes (docs/design.md, "Background load").

- `config`: the `load:` section of a target (and of `bench`), its rate, schedule, trace and
  length settings;
- `arrivals`: the arrival processes (Poisson, constant, gamma), seeded, and the rate estimate;
- `workload`: prompt and answer length distributions and trace files (`builtin:NAME` names
  one shipped in `traces/`);
- `driver`: `LoadDriver`, which sends the arrivals on their schedule and counts what its cap
  drops.

Nothing is imported here: the settings import `config` and `workload`, which sit below the
rest of the daemon, while `driver` sits above the recording it feeds (tests/unit/test_layers.py
places each module on its own layer).
"""
