"""The path template of the application route a request reaches, for a ``per_route`` route
(:meth:`~ratelimit.asgi.routes.Route.key_for`), read before the application routes it.

A Starlette (or FastAPI) application is asked the way its router asks: each route's
``matches`` in order, into ``Mount``s (the mount's path, then the inner route's), the first
full match naming the template (``/items/{id}``, ``/api/users/{user_id}``); a route that
matches the path but not the method (a 405) counts under its template too. The router is
found from ``scope["app"]`` (set by the Starlette application the middleware runs in) or
by following ``.app`` from the wrapped application to one that has a ``router``.

An application of another framework has no router this can read: its requests then share
one counter (:data:`UNKNOWN`; never one per path, which a client could mint without end),
which the middleware says once in the log.

Example::

    template = RouteTemplates(app)
    template(scope)  # "/items/{id}"
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("ratelimit")
UNKNOWN = "(routes unknown)"
"""The template of every request of an application whose router cannot be read: one shared
counter (never one per path, which a client could mint without end)."""
MAX_WRAPPERS = 32
"""How many ``.app`` wrappers are followed looking for a router."""


class RouteTemplates:
    """The path template of a request's route in ``app`` (see the module): ``None`` for a
    path no route serves; :data:`UNKNOWN` where no router can be read."""

    __slots__ = ("_app", "_warned")

    def __init__(self, app: object) -> None:
        self._app = app
        self._warned = False

    def __call__(self, scope: dict[str, Any]) -> str | None:
        routes = _routes_of(scope.get("app")) or _routes_of(self._app)
        if routes is None:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "ratelimit: a per_route Route found no Starlette router in the application "
                    "to read path templates from: its requests share one counter, %r",
                    UNKNOWN,
                )
            return UNKNOWN
        return _template(routes, scope, "")


def _routes_of(app: object) -> list[Any] | None:
    """The routes of the first router found from ``app`` down its ``.app`` wrappers."""
    for _ in range(MAX_WRAPPERS):
        if app is None:
            return None
        router = getattr(app, "router", None)
        routes = getattr(router, "routes", None)
        if isinstance(routes, list):
            return routes
        app = getattr(app, "app", None)
    return None


def _template(routes: list[Any], scope: dict[str, Any], prefix: str) -> str | None:
    from starlette.routing import Match, Mount

    partial: str | None = None
    for route in routes:
        try:
            match, child = route.matches(scope)
        except (KeyError, TypeError, ValueError):  # a route of its own kind: not readable
            continue
        if match == Match.NONE:
            continue
        path = getattr(route, "path", "")
        if isinstance(route, Mount):
            inner = getattr(route, "routes", None)
            if match == Match.FULL and isinstance(inner, list) and inner:
                found = _template(inner, {**scope, **child}, prefix + path)
                if found is not None:
                    return found
                continue
        if match == Match.FULL:
            return prefix + path
        if partial is None:  # the path matches, the method does not (a 405): its template
            partial = prefix + path
    return partial
