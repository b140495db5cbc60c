"""The targets this replica runs, as a set that changes at run time.

- `shard`: which replica owns a target (rendezvous hashing of its name);
- `changes`: the one table of which settings restart which state (`RESETS`);
- `member`: one target's live state, kept by its name;
- `fleet`: `Fleet`, every member by name, and `apply`, which diffs a wanted set against it;
- `reload`: `Reloader`, the configuration in use and its reloads (SIGHUP, `POST /-/reload`,
  the checksum poll), validated first and applied in one step.
"""
