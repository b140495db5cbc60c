"""The import layers of prober/, read from the source with `ast`: every import, at module
level or inside a function, goes to the same layer or a lower one, and no chain of imports
comes back to where it started (so no import is made late to dodge a cycle).

A new module belongs in `LAYERS`: where its imports and its importers put it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "prober"

# Low to high. A module of prober/ is named by its file (`timings`), a subpackage by its folder
# (`bench`: its modules import each other freely), a module of a `SPANNING` package by both
# (`load.driver`); `prober` is the package's own __init__.
LAYERS: list[tuple[str, set[str]]] = [
    ("vocabulary", {"prober", "kinds", "result", "logs", "metric_specs"}),
    (
        "leaf helpers",
        {
            "timings",
            "load",
            "load.arrivals",
            "prompts",
            "runtime",
            "webconfig",
            "validation",
            "load.workload",
            "checks",
            "cadence",
        },
    ),
    ("one request, one signal", {"request", "summary", "metrics", "recent"}),
    ("exposition", {"exposition", "scrapes"}),
    ("configuration", {"section", "load.config", "config", "settings", "targets"}),
    ("discovery", {"discovery"}),
    ("capacity", {"capacity"}),
    ("recording", {"record"}),
    ("probes and load", {"schedule", "load.driver", "preflight"}),
    ("fleet", {"fleet"}),
    ("daemon", {"web", "status"}),
    ("tools", {"sim", "bench"}),
    ("experiments", {"demo"}),
    ("command line", {"cli"}),
]
LAYER = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


# Packages whose modules sit on different layers, each placed on its own (`load.config` with
# the settings, `load.driver` above the recording it feeds); their __init__ imports nothing.
SPANNING = {"load"}


def unit(module: str) -> str:
    """The name `LAYERS` knows `module` by."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in SPANNING:
        return f"{parts[1]}.{parts[2]}"
    return parts[1] if len(parts) > 1 else "prober"


def resolve(name: str) -> str:
    """The module of prober/ that importing `name` loads: `name`, or the nearest package."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports(module: str) -> Iterator[tuple[int, str]]:
    """(line, module of prober/) for every import in `module`'s file, wherever it stands."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "prober" or alias.name.startswith("prober."):
                    yield node.lineno, resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base != "prober" and not base.startswith("prober."):
                continue
            for alias in node.names:  # `from prober import timings` loads prober.timings
                submodule = f"{base}.{alias.name}"
                yield node.lineno, submodule if submodule in MODULES else resolve(base)


GRAPH = {m: {target for _, target in imports(m)} - {m} for m in MODULES}


def test_every_module_has_a_layer() -> None:
    missing = sorted({unit(m) for m in MODULES} - LAYER.keys())
    assert not missing, f"add {missing} to LAYERS in {Path(__file__).name}"


def test_imports_go_down_the_layers() -> None:
    wrong = []
    for module in MODULES:
        here = LAYER.get(unit(module))
        for line, target in imports(module):
            there = LAYER.get(unit(target))
            if here is not None and there is not None and there > here:
                wrong.append(
                    f"{MODULES[module].relative_to(ROOT)}:{line}: {module} ({LAYERS[here][0]})"
                    f" imports {target} ({LAYERS[there][0]})"
                )
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle() -> None:
    """Depth-first over the module graph, lazy imports included: a back edge is a cycle."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    cycles: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module)
    assert not cycles, "\n".join(cycles)


def test_the_check_sees_lazy_and_relative_imports() -> None:
    """The walk finds function-level imports (the CLI's) and resolves package imports."""
    assert "prober.web" in GRAPH["prober.cli"]  # imported inside run_daemon
    assert "prober.timings" in GRAPH["prober.summary"]  # `from prober import timings`
    assert "prober" in GRAPH["prober.request.wire"]  # `from prober import __version__`
    assert resolve("prober.bench.cli") == "prober.bench.cli"


# Who writes the daemon's series (docs/design.md §1): `metrics` declares them and records a
# result; `record` is the one writer of every per-target series, the capacity's included (the
# queue waits it returns, the failed engine scrapes it reports); `request/wire` sets the
# process-wide stamping gauge once. A series written anywhere else is a second writer.
WRITERS = {
    "prober/metrics.py",
    "prober/record.py",
    "prober/request/wire.py",
}
WRITES = (".labels(", ".describe_target(", ".record_probe(", ".expect(", "metrics.record(")


def test_one_writer_of_the_series() -> None:
    found = {
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if any(write in path.read_text() for write in WRITES)
    }
    assert found <= WRITERS, sorted(found - WRITERS)
