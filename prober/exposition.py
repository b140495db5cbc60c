"""`/metrics`, byte for byte what prometheus-client writes, in a fraction of its time.

A daemon with many targets exports thousands of series. prometheus-client does per-series
work on every scrape: `collect()` builds a `Sample` and a label dict per bucket, then the
encoder sorts, escapes and formats them again, all on the event loop, and every token stamp
waits for it (figures, dated: docs/performance.md). Here the `name{labels} ` prefix of each
series is built once, when the series first shows up, and a render only reads the values and
formats them.

Rendered here: prometheus-client's own `Counter`, `Gauge` and `Histogram` (everything
`Metrics` creates), single-process values, legacy-valid names (what we define), in the text
format (0.0.4 and 1.0.0) and OpenMetrics 1.0.0 (exemplars included), with `underscores` or
`allow-utf-8` escaping: the encoders are the identity on legacy names under both. Any other
collector (the capacity collector's families) is collected on the event loop and formatted
by prometheus-client's encoder with the rest, a collector at a time, in its place; any other
request (`name[]` filter, another format or escaping) goes to `make_aiohttp_handler` itself
(`scrapes.py` serves `/metrics`).
tests/unit/test_exposition.py holds the two outputs equal, byte for byte, over generated
registries.

This reads prometheus-client internals (`_metrics`, `_buckets`, `_value`, `_created`, the
registry's collector list). A shape it does not know turns the fast path off for that metric
or that scrape; any exception while rendering (an upgrade that moved an internal) hands that
scrape to `make_aiohttp_handler`, counts it in `llmprober_exposition_fallback_total` and is
logged once (`exposition_fallback`): never a failed scrape, never different output. The
byte-equality tests pin the behaviour, and pyproject.toml the versions they ran against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import partial
from importlib import metadata
from itertools import accumulate
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, exposition
from prometheus_client import metrics as client_metrics
from prometheus_client import validation as client_validation
from prometheus_client import values as client_values
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString as _go_string

from prober.logs import get_logger
from prober.metric_specs import EXPOSITION_FALLBACK, counter

TEXT, OPENMETRICS = "text", "openmetrics"
_ESCAPINGS = (openmetrics.UNDERSCORES, openmetrics.ALLOWUTF8)
_KINDS = (Counter, Gauge, Histogram)
_EOF = "# EOF\n"
floatToGoString: Callable[[float], str] = _go_string  # untyped upstream
_generate_openmetrics: Callable[..., bytes] = openmetrics.generate_latest
_log = get_logger("prober.exposition")


def fmt(value: float) -> str:
    """`floatToGoString`, with its common case (finite, below 1e6: plain `repr`) inlined."""
    if -math.inf < value < 1e6:
        return repr(value)
    return floatToGoString(value)


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{name}="{_label_value(value)}"' for name, value in sorted(pairs))
    return f"{{{body}}}" if body else ""


def _exemplar(exemplar: Any) -> str:
    labels = _labels(exemplar.labels.items())
    if exemplar.timestamp is None:
        return f" # {labels} {floatToGoString(exemplar.value)}"
    return f" # {labels} {floatToGoString(exemplar.value)} {exemplar.timestamp}"


class _Series:
    """One child's prefixes (`name{labels} `), built once, and its last exemplar strings."""

    __slots__ = ("child", "created", "exemplars", "prefixes", "values")

    def __init__(self, family: _Family, child: Any, labels: list[tuple[str, str]]) -> None:
        self.child = child
        name = family.name
        self.created = f"{name}_created{_labels(labels)} "
        if family.kind is Histogram:
            bounds = child._upper_bounds
            self.values: list[Any] = list(child._buckets)
            self.prefixes = [
                f"{name}_bucket{_labels([*labels, ('le', floatToGoString(b))])} " for b in bounds
            ]
            self.prefixes += [f"{name}_count{_labels(labels)} ", f"{name}_sum{_labels(labels)} "]
        else:
            suffix = "_total" if family.kind is Counter else ""
            self.values = [child._value]
            self.prefixes = [f"{name}{suffix}{_labels(labels)} "]
        self.exemplars: list[tuple[Any, str]] = [(None, "")] * len(self.values)

    def exemplar(self, i: int, exemplar: Any) -> str:
        """The exemplar string of value `i`, formatted again only when it changed."""
        seen, text = self.exemplars[i]
        if exemplar is not seen:
            text = _exemplar(exemplar)
            self.exemplars[i] = (exemplar, text)
        return text


class _Family:
    """A prometheus-client metric the fast path can render, and its series' prefixes."""

    def __init__(self, metric: Any) -> None:
        meta = metric._get_metric()
        self.metric = metric
        self.kind = type(metric)
        self.name: str = meta.name
        self.type: str = meta.type
        self.unit: str = meta.unit
        self.doc: str = meta.documentation
        self.labelnames: tuple[str, ...] = tuple(metric._labelnames)
        self.series: dict[tuple[str, ...], _Series] = {}

    @staticmethod
    def supports(metric: Any) -> bool:
        if type(metric) not in _KINDS:
            return False
        suffixes = ("", "_total", "_bucket", "_count", "_sum", "_created")
        labels = (*metric._labelnames, "le")
        # Private helpers, read here (inside a guarded render) rather than imported: an
        # upgrade without them must not break the import.
        valid_name = client_validation._is_valid_legacy_metric_name
        valid_label = client_validation._is_valid_legacy_labelname
        return all(valid_name(metric._name + s) for s in suffixes) and all(map(valid_label, labels))

    def children(self) -> list[tuple[tuple[str, ...], Any]] | None:
        metric: Any = self.metric
        children: list[tuple[tuple[str, ...], Any]]
        if not self.labelnames:
            children = [((), metric)]
        else:
            with metric._lock:
                children = list(metric._metrics.items())
        if any("_child_samples" in vars(child) for _, child in children):
            return None  # Gauge.set_function: a callback decides the value
        return children

    def series_of(self, labelvalues: tuple[str, ...], child: Any) -> _Series:
        series = self.series.get(labelvalues)
        if series is None or series.child is not child:
            series = _Series(self, child, list(zip(self.labelnames, labelvalues, strict=True)))
            self.series[labelvalues] = series
        return series

    def render(self, out: list[str], form: str, children: list[tuple[Any, Any]]) -> None:
        """Append the family in `form`, its children as `children()` read them."""
        if len(self.series) > len(children):  # children were removed: forget their prefixes
            keep = {labelvalues for labelvalues, _ in children}
            self.series = {k: v for k, v in self.series.items() if k in keep}
        created = client_metrics._use_created and self.kind is not Gauge
        if form == TEXT:
            self._text(out, children, created)
        else:
            self._openmetrics(out, children, created)

    def _append(self, out: list[str], series: _Series, exemplars: bool) -> None:
        # Values are read as `MutexValue._value`, without its lock: a float attribute read is
        # atomic, and the encoders take the locks one value at a time anyway.
        prefixes, values = series.prefixes, series.values
        if self.kind is not Histogram:
            exemplar = values[0]._exemplar if exemplars and self.kind is Counter else None
            tail = "" if exemplar is None else series.exemplar(0, exemplar)
            out.append(f"{prefixes[0]}{fmt(values[0]._value)}{tail}\n")
            return
        # Bucket counts are whole numbers, so `fmt` is `repr` below 1e6.
        counts = list(accumulate([bucket._value for bucket in values]))
        if exemplars:
            out += [
                f"{prefixes[i]}{repr(c) if c < 1e6 else fmt(c)}"
                f"{'' if e is None else series.exemplar(i, e)}\n"
                for i, (c, e) in enumerate(zip(counts, [v._exemplar for v in values], strict=True))
            ]
        else:
            out += [
                f"{p}{repr(c) if c < 1e6 else fmt(c)}\n"
                for p, c in zip(prefixes, counts, strict=False)
            ]
        out.append(f"{prefixes[-2]}{fmt(counts[-1])}\n")  # _count: the +Inf bucket
        if series.child._upper_bounds[0] >= 0:
            out.append(f"{prefixes[-1]}{fmt(series.child._sum._value)}\n")

    def _text(self, out: list[str], children: list[tuple[Any, Any]], created: bool) -> None:
        doc = self.doc.replace("\\", r"\\").replace("\n", r"\n")
        name = f"{self.name}_total" if self.kind is Counter else self.name
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {self.type}\n")
        created_lines = []
        for labelvalues, child in children:
            series = self.series_of(labelvalues, child)
            self._append(out, series, exemplars=False)
            if created:
                created_lines.append(f"{series.created}{fmt(child._created)}\n")
        if created_lines:
            out.append(f"# HELP {self.name}_created {doc}\n# TYPE {self.name}_created gauge\n")
            out.extend(created_lines)

    def _openmetrics(self, out: list[str], children: list[tuple[Any, Any]], created: bool) -> None:
        out.append(f"# HELP {self.name} {_label_value(self.doc)}\n# TYPE {self.name} {self.type}\n")
        if self.unit:
            out.append(f"# UNIT {self.name} {self.unit}\n")
        for labelvalues, child in children:
            series = self.series_of(labelvalues, child)
            self._append(out, series, exemplars=True)
            if created:
                out.append(f"{series.created}{fmt(child._created)}\n")


def fallback_counter(registry: CollectorRegistry) -> Counter:
    """`llmprober_exposition_fallback_total`, declared on `registry` (once per registry)."""
    return counter(EXPOSITION_FALLBACK, registry)


def _installed(distribution: str) -> str:
    """The installed version, for the log line; never an error inside the fallback."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:  # vendored or run from a source tree
        return "unknown"


class _Collected:
    """A collector's families as its `collect` made them on the event loop (a custom
    collector reads the loop's state), for the library's encoder to format in the worker:
    the families are new objects nobody else holds, and formatting them (sorting, escaping,
    a float's text per sample) was most of the time the loop spent on the capacity
    collector of 201 targets. A collector with a `read_on_loop` and a `families_from` step (the
    capacity collector) has only the first run on the loop; its families are made in the
    worker too, from what it read. A registry of that one collector to the encoders."""

    def __init__(self, collector: Collector, escaping: str) -> None:
        read = getattr(collector, "read_on_loop", None)
        families = getattr(collector, "families_from", None)
        if callable(read) and callable(families):
            self._read: Any = read()
            self._families: Callable[[Any], Iterable[Any]] | None = families
        else:
            self._read, self._families = list(collector.collect()), None
        self.escaping = escaping

    def collect(self) -> Iterable[Any]:
        return self._read if self._families is None else self._families(self._read)

    def render(self, out: list[str], form: str) -> None:
        if form == TEXT:
            out.append(exposition.generate_latest(self, escaping=self.escaping).decode())
            return
        text = _generate_openmetrics(self, escaping=self.escaping).decode()
        out.append(text.removesuffix(_EOF))


# What a render needs from the event loop's side, in the registry's order: each collector
# the fast path renders, with its children as read then, or the families any other
# collector made then.
Plan = list[_Collected | tuple[_Family, list[tuple[tuple[str, ...], Any]]]]


class FastExposition:
    """Renders a registry as prometheus-client would; `None` where it cannot vouch for that.

    A render is two steps. `plan` runs where the metrics are updated (the event loop): it
    reads the registry's collectors and each family's children under their locks, and has
    any other collector collect there (a custom collector computes its values from the
    loop's state). `assemble` formats the plan and may run in another thread: it reads
    values without locks, as `_append` says, has the library's encoder format the other
    collectors' families, and touches no state but the families' prefix caches, so one
    `assemble` at a time (`scrapes.py` has one worker). `render` does both at once.

    `fallbacks` counts the renders that raised (and so returned None); the first is logged.
    """

    def __init__(self, registry: CollectorRegistry, fallbacks: Counter | None = None) -> None:
        self.registry = registry
        self.fallbacks = fallbacks
        self._families: dict[int, _Family | None] = {}
        self._logged = False

    def collectors(self) -> list[Collector] | None:
        registry: Any = self.registry
        if client_values.ValueClass is not client_values.MutexValue:
            return None  # multiprocess mode: values live in files
        with registry._lock:  # a registry without these raises: a counted fallback
            if registry._target_info:
                return None
            return list(registry._collector_to_names)

    def family(self, collector: Collector) -> _Family | None:
        key = id(collector)
        if key not in self._families:
            supported = _Family.supports(collector)
            self._families[key] = _Family(collector) if supported else None
        family = self._families[key]
        return family if family is not None and family.metric is collector else None

    def render(self, form: str, escaping: str = openmetrics.UNDERSCORES) -> bytes | None:
        """The exposition in `form` (TEXT or OPENMETRICS 1.0.0), or None: ask the library."""
        plan = self.plan(form, escaping)
        return None if plan is None else self.assemble(plan, form)

    def plan(self, form: str, escaping: str = openmetrics.UNDERSCORES) -> Plan | None:
        """The loop's step of a render (see the class), or None: ask the library."""
        try:
            return self._plan(form, escaping)
        except Exception as exc:
            # Private reads can fail in any way after an upgrade; the library's public path
            # still works, so this scrape is its (one output either way, never a 500).
            self._fell_back(exc)
            return None

    def assemble(self, plan: Plan, form: str) -> bytes | None:
        """The exposition from `plan`, or None (counted, as `plan`): ask the library."""
        try:
            out: list[str] = []
            for part in plan:
                if isinstance(part, _Collected):
                    part.render(out, form)
                else:
                    part[0].render(out, form, part[1])
            if form == OPENMETRICS:
                out.append(_EOF)
            return "".join(out).encode()
        except Exception as exc:
            self._fell_back(exc)
            return None

    def _fell_back(self, exc: Exception) -> None:
        self._families = {}  # whatever was cached may be what broke
        if self.fallbacks is not None:
            self.fallbacks.inc()
        if not self._logged:
            self._logged = True
            _log.warning(
                "exposition_fallback",
                error=f"{type(exc).__name__}: {exc}",
                prometheus_client=_installed("prometheus-client"),
                note="/metrics served by prometheus-client; counted in "
                "llmprober_exposition_fallback_total, logged once",
            )

    def _plan(self, form: str, escaping: str) -> Plan | None:
        collectors = self.collectors()
        if collectors is None or escaping not in _ESCAPINGS:
            return None
        if len(self._families) > 2 * len(collectors):  # collectors unregistered over time
            live = {id(c) for c in collectors}
            self._families = {k: v for k, v in self._families.items() if k in live}
        plan: Plan = []
        for collector in collectors:
            family = self.family(collector)
            children = None if family is None else family.children()
            if family is None or children is None:
                plan.append(_Collected(collector, escaping))
            else:
                plan.append((family, children))
        return plan


def negotiate(accept: str) -> tuple[str | None, str, str]:
    """(form or None, escaping, content type) that prometheus-client picks for `accept`."""
    encoder, content_type = exposition.choose_encoder(accept)
    func: Callable[..., bytes] = encoder
    keywords: dict[str, str] = {}
    if isinstance(encoder, partial):
        func, keywords = encoder.func, encoder.keywords
    escaping = keywords.get("escaping", openmetrics.UNDERSCORES)
    if escaping not in _ESCAPINGS:
        return None, escaping, content_type
    if func is exposition.generate_latest:
        return TEXT, escaping, content_type
    version = keywords.get("version", "1.0.0")
    if func is openmetrics.generate_latest and version.split(".")[0] == "1":
        return OPENMETRICS, escaping, content_type
    return None, escaping, content_type
