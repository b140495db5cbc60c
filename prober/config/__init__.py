"""The daemon's configuration, one concern a module; `prober.settings` names the public parts.

- `errors`: `ConfigError` (one `field: message` line per fault) and `FieldError`;
- `target`: a target's model (`TargetConfig`) and its sections (SLO, timeouts, TLS, traffic);
- `group`: a target group (`TargetGroupConfig`): a discovery source and its targets' template;
- `discovery`: the group's source sections (`file_sd`, `http_sd`, `dns`) and what an address is;
- `server`: the `server:`, `logging:` and `shard:` sections;
- `urls`: what a target's URL may be;
- `expect`: a target's answer checks (`expect:`), compiled and checked at load;
- `proxy`: a target's forward proxy (`proxy:`, or the environment's `HTTPS_PROXY` ...);
- `secrets`: the one place a target's credentials are read and registered;
- `sources`: the YAML file and the `LLMPROBER_*` environment as pydantic-settings sources;
- `model`: the whole `Settings` and `load_settings`, which validates it once.

A target's `load:` section is `prober.load.config`; every section is built on
`prober.section.Section`; every fault is worded by `prober.validation`.
"""
