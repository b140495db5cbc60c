"""The status page's routes: `/` (every target, `PAGE_TARGETS` to a page) and `/targets/NAME`.

Rendered with Jinja2 through aiohttp-jinja2, autoescaping on (STYLE: pages are templates,
never strings put together), from the view model (`view.py`). No script: the page reloads
itself every `REFRESH_SECONDS` (a meta refresh). Both routes sit behind the web config's TLS
and basic auth like every route but the health checks (the app's middleware).
"""

from __future__ import annotations

import aiohttp_jinja2
import jinja2
from aiohttp import web

from prober import __version__
from prober.fleet.compose import Discovery
from prober.fleet.fleet import Fleet
from prober.fleet.reload import Reloader
from prober.status.view import Sources, index_names, page_view

REFRESH_SECONDS = 15
SOURCES = web.AppKey("status_sources", Sources)


def add_status_routes(app: web.Application, fleet: Fleet, reloader: Reloader) -> None:
    """The page's routes and its template environment, on `app`."""

    def last_reload() -> tuple[float, bool, str] | None:
        last = reloader.last
        return None if last is None else (last[0], last[1].ok, last[1].message)

    app[SOURCES] = Sources(
        members=lambda: fleet.members,
        recent=fleet.recorder.recent,
        version=__version__,
        last_reload=last_reload,
        discovery=lambda: find_discovery(app, fleet, reloader),
    )
    aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("prober.status", "templates"),
        autoescape=True,  # every string shown is hostile text until escaped
        undefined=jinja2.StrictUndefined,
        context_processors=[_common],
    )
    app.router.add_get("/", _index)
    app.router.add_get("/targets/{name:.+}", _target)


def find_discovery(app: web.Application, *holders: object) -> Discovery | None:
    """The daemon's discovery, wherever it is kept (an app key, or the fleet's or the
    reloader's `discovery`); None where the daemon runs none."""
    kept = [*app.values(), *(getattr(h, "discovery", None) for h in holders)]
    return next((v for v in kept if isinstance(v, Discovery)), None)


async def _common(_: web.Request) -> dict[str, object]:
    return {"refresh_seconds": REFRESH_SECONDS}


def _page_number(request: web.Request) -> int:
    raw = request.query.get("page", "1")  # past the last page: the last one (`index_names`)
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 9 else 1


async def _index(request: web.Request) -> web.Response:
    sources = request.app[SOURCES]
    names, page, pages = index_names(sources.members(), _page_number(request))
    view = page_view(sources, names, page=page, pages=pages)
    return _render("index.html", request, {"view": view})


async def _target(request: web.Request) -> web.Response:
    sources = request.app[SOURCES]
    name = request.match_info["name"]
    if name not in sources.members():
        view = page_view(sources, [])
        return _render("missing.html", request, {"view": view}, status=404)
    view = page_view(sources, [name])
    return _render("target.html", request, {"view": view, "target": view.targets[0]})


def _render(
    template: str, request: web.Request, context: dict[str, object], *, status: int = 200
) -> web.Response:
    response = aiohttp_jinja2.render_template(template, request, context, status=status)
    # The page runs no script and embeds nothing: say so, so a bug in escaping cannot run one.
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-store"
    return response
