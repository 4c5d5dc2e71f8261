"""One HTTP request or WebSocket handshake as the limiter reads it: a view over the ASGI
scope (no framework needed), with the client address (:mod:`ratelimit.asgi.proxies`: the
forwarding header counts only from a proxy the application trusts) and the path the
application routes on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

from ratelimit.asgi.header_map import HeaderMap, field_values
from ratelimit.asgi.proxies import NO_PROXIES, TrustedProxies
from ratelimit.errors import ConfigurationError


def route_path(scope: Mapping[str, Any]) -> str:
    """The path the application routes on: ``scope["path"]`` without the ``root_path``
    before it, as Starlette routes (``starlette._utils.get_route_path``). ``uvicorn
    --root-path /api`` serves ``GET /ping`` with path ``/api/ping`` and root_path ``/api``;
    an application mounted at ``/v1`` sees ``/v1/ping`` under root_path ``/v1``; both route
    on ``/ping``. A path that does not continue its root_path with ``/`` is kept whole
    (servers and older frameworks that already strip it), and the root itself is ``""``."""
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    if not root or not path.startswith(root):
        return path
    if len(path) == len(root):
        return ""
    return path[len(root) :] if path[len(root)] == "/" else path


class HTTPRequest:
    """What selector sources read: the ASGI scope of one request (or WebSocket handshake).

    ``method`` (``"GET"``; ``"WEBSOCKET"`` for a handshake), ``path`` (the whole path, as
    the scope has it), ``route_path`` (the path the application routes on: without
    ``root_path``, as under a mount or ``uvicorn --root-path``), ``headers`` (a read-only
    mapping whose names are case-insensitive, as HTTP's are: ``headers.get("X-API-Key")``
    and ``headers["x-api-key"]`` read one field; a field sent on several lines reads as
    its lines joined with ``", "``; see :class:`~ratelimit.asgi.header_map.HeaderMap`),
    ``query`` (the first value of each parameter), ``path_params`` (the route's own and the
    framework's), ``client_ip`` (see :class:`~ratelimit.asgi.TrustedProxies`;
    ``"unknown"`` when it cannot be known), ``user`` (``scope["user"]``, set by
    authentication middleware), and :meth:`json` for the body, where a framework has read
    it (the dependency); the middleware never reads a body.
    """

    __slots__ = (
        "_body",
        "_client",
        "_headers",
        "_json",
        "_proxies",
        "_query",
        "path_params",
        "scope",
    )

    def __init__(
        self,
        scope: Mapping[str, Any],
        proxies: TrustedProxies = NO_PROXIES,
        path_params: Mapping[str, str] | None = None,
        body: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        self.scope = scope
        self._proxies = proxies
        self._client: Any = _UNREAD
        self.path_params: Mapping[str, Any] = {
            **scope.get("path_params", {}),
            **(path_params or {}),
        }
        self._body = body
        self._headers: HeaderMap | None = None
        self._query: dict[str, str] | None = None
        self._json: Any = _UNREAD

    @property
    def client_ip(self) -> str:
        """The client's address (see :class:`~ratelimit.asgi.TrustedProxies`), read when
        first asked."""
        if self._client is _UNREAD:
            self._client = self._proxies.client(self.scope)
        client: str = self._client
        return client

    def header_values(self, name: str) -> list[str]:
        """Every line of one header, by name (any case), in order."""
        return field_values(self.scope.get("headers", ()), name)

    def query_values(self, name: str) -> list[str]:
        """Every value of one query-string parameter, in order."""
        raw = self.scope.get("query_string", b"").decode("latin-1")
        return [value for key, value in parse_qsl(raw, keep_blank_values=True) if key == name]

    def header(self, name: str) -> str | None:
        """One header by name, any case (repeated ones joined with ``", "``)."""
        found = field_values(self.scope.get("headers", ()), name)
        return (found[0] if len(found) == 1 else ", ".join(found)) if found else None

    @property
    def method(self) -> str:
        return str(self.scope.get("method", "WEBSOCKET"))

    @property
    def path(self) -> str:
        return str(self.scope.get("path", ""))

    @property
    def route_path(self) -> str:
        return route_path(self.scope)

    @property
    def headers(self) -> HeaderMap:
        """The request's header fields, by name in any case (read-only)."""
        if self._headers is None:
            self._headers = HeaderMap(self.scope.get("headers", ()))
        return self._headers

    @property
    def query(self) -> Mapping[str, str]:
        if self._query is None:
            query: dict[str, str] = {}
            raw = self.scope.get("query_string", b"").decode("latin-1")
            for name, value in parse_qsl(raw, keep_blank_values=True):
                query.setdefault(name, value)
            self._query = query
        return self._query

    @property
    def user(self) -> Any:
        return self.scope.get("user")

    async def json(self) -> Any:
        """The body parsed as JSON (``None`` when it is not JSON). Only where a framework
        reads the body (the route dependency); the middleware has none to give."""
        if self._json is _UNREAD:
            if self._body is None:
                raise ConfigurationError(
                    "the middleware never reads a request body: take selectors from the "
                    "body in a route dependency (ratelimit.asgi.RouteLimit) instead"
                )
            try:
                self._json = await self._body()
            except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON: no value
                self._json = None
        return self._json


_UNREAD: Any = object()
