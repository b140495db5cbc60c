"""Panel builders for grafana/generate.py: modern Grafana JSON (schemaVersion 39) for
timeseries, heatmap and stat panels, rows, a grid layout and the template variables.

Every query goes through the `datasource` variable (`${datasource}`), so the dashboards are
provisionable as files with no `__inputs` and work with any Prometheus datasource.
"""

from __future__ import annotations

from typing import Any

Panel = dict[str, Any]
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'target=~"$target", model=~"$model"'
SEL_MODE = SEL + ', mode=~"$mode"'
RI = "$__rate_interval"


def q(expr: str, legend: str, ref: str, **extra: Any) -> dict[str, Any]:
    return {
        "datasource": DS,
        "refId": ref,
        "expr": expr,
        "legendFormat": legend,
        "range": True,
        "instant": False,
        **extra,
    }


def quantiles(
    metric: str,
    sel: str = SEL_MODE,
    qs: tuple[str, ...] = ("0.5", "0.95", "0.99"),
) -> list[dict[str, Any]]:
    """histogram_quantile per target over the rate of the _bucket series."""
    out = []
    for ref, quant in zip("ABCDE", qs, strict=False):
        expr = (
            f"histogram_quantile({quant}, sum by (target, model, le) "
            f"(rate({metric}_bucket{{{sel}}}[{RI}])))"
        )
        pct = f"p{round(float(quant) * 100):g}"
        out.append(q(expr, f"{{{{target}}}} {pct}", ref))
    return out


def slo_line(metric: str, ref: str = "S") -> dict[str, Any]:
    return q(f"max by (target, model) ({metric}{{{SEL}}})", "{{target}} SLO", ref)


def dashed(ref: str, color: str = "red") -> dict[str, Any]:
    """Override drawing the series of one query as a dashed reference line."""
    return {
        "matcher": {"id": "byFrameRefID", "options": ref},
        "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "custom.fillOpacity", "value": 0},
            {"id": "color", "value": {"mode": "fixed", "fixedColor": color}},
        ],
    }


def timeseries(
    title: str,
    targets: list[dict[str, Any]],
    unit: str,
    description: str,
    *,
    overrides: list[dict[str, Any]] | None = None,
    stack: bool = False,
    bars: bool = False,
    threshold: float | None = None,
    max_: float | None = None,
) -> Panel:
    custom: dict[str, Any] = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 60 if (stack or bars) else 10,
        "showPoints": "never",
        "spanNulls": False,
        "axisSoftMin": 0,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "thresholdsStyle": {"mode": "line+area" if threshold is not None else "off"},
    }
    steps: list[dict[str, Any]] = [
        {"color": "transparent" if threshold is not None else "green", "value": None}
    ]
    if threshold is not None:
        steps.append({"color": "red", "value": threshold})
    defaults: dict[str, Any] = {
        "unit": unit,
        "min": 0,
        "custom": custom,
        "color": {"mode": "palette-classic"},
        "thresholds": {"mode": "absolute", "steps": steps},
    }
    if max_ is not None:
        defaults["max"] = max_
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {
                "showLegend": True,
                "displayMode": "table",
                "placement": "bottom",
                "calcs": ["lastNotNull", "max"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def heatmap(title: str, metric: str, description: str) -> Panel:
    expr = f"sum by (le) (increase({metric}_bucket{{{SEL_MODE}}}[{RI}]))"
    return {
        "type": "heatmap",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [q(expr, "{{le}}", "A", format="heatmap")],
        "fieldConfig": {
            "defaults": {
                "custom": {
                    "scaleDistribution": {"type": "linear"},
                    "hideFrom": {"legend": False, "tooltip": False, "viz": False},
                }
            },
            "overrides": [],
        },
        "options": {
            "calculate": False,
            "cellGap": 1,
            "yAxis": {"unit": "s", "axisPlacement": "left"},
            "rowsFrame": {"layout": "auto"},
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "steps": 64,
                "exponent": 0.5,
                "scale": "exponential",
                "fill": "dark-orange",
                "reverse": False,
            },
            "cellValues": {"unit": "short"},
            "filterValues": {"le": 1e-09},
            "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
            "legend": {"show": True},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
        },
    }


def stat(
    title: str,
    targets: list[dict[str, Any]],
    unit: str,
    description: str,
    steps: list[tuple[str, float | None]],
    mappings: dict[float, tuple[str, str]] | None = None,
) -> Panel:
    """A stat panel; `mappings`: value -> (text, colour), shown instead of the number."""
    shown = [
        {
            "type": "value",
            "options": {
                f"{value:g}": {"text": text, "color": color, "index": i}
                for i, (value, (text, color)) in enumerate(mappings.items())
            },
        }
    ] if mappings else []  # fmt: skip
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "mappings": shown,
                "color": {"mode": "thresholds"},
                "thresholds": {
                    "mode": "absolute",
                    "steps": [{"color": c, "value": v} for c, v in steps],
                },
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "area",
            "textMode": "auto",
            "orientation": "auto",
            "justifyMode": "auto",
            "wideLayout": True,
        },
    }


def row(title: str) -> Panel:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def layout(panels: list[tuple[Panel, int, int]]) -> list[Panel]:
    """Place (panel, width, height) left to right, wrapping at 24 columns; ids in order."""
    out, x, y, line_h = [], 0, 0, 0
    for pid, (panel, w, h) in enumerate(panels, start=1):
        if panel["type"] == "row" or x + w > 24:
            x, y, line_h = 0, y + line_h, 0
        panel = {"id": pid, "gridPos": {"h": h, "w": w, "x": x, "y": y}, **panel}
        out.append(panel)
        x, line_h = x + w, max(line_h, h)
        if panel["type"] == "row":
            x, y, line_h = 0, y + h, 0
    return out


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "query": {"query": query, "refId": f"PrometheusVariableQueryEditor-{name}"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "hide": 0,
    }


def templating(with_mode: bool, with_group: bool = False) -> dict[str, Any]:
    variables: list[dict[str, Any]] = [
        {
            "type": "datasource",
            "name": "datasource",
            "label": "Data source",
            "query": "prometheus",
            "current": {},
            "options": [],
            "refresh": 1,
            "regex": "",
            "hide": 0,
        }
    ]
    scoped = 'llmprober_requests_total{target=~"$target"}'
    variables.append(variable("target", "Target", "label_values(llmprober_requests_total, target)"))
    variables.append(variable("model", "Model", f"label_values({scoped}, model)"))
    if with_mode:
        variables.append(variable("mode", "Mode", f"label_values({scoped}, mode)"))
    if with_group:  # the groups of `target_groups:`, from the targets' info series
        variables.append(variable("group", "Group", "label_values(llmprober_target_info, group)"))
    return {"list": variables}


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list[Panel],
    with_mode: bool,
    with_group: bool = False,
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["llm", "llm-prober"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": [
            {
                "title": "Runbook",
                "type": "link",
                "icon": "doc",
                "targetBlank": True,
                "url": "https://github.com/llm-prober/llm-prober/blob/main/docs/runbook.md",
            }
        ],
        "templating": templating(with_mode, with_group),
        "panels": panels,
    }
