"""Which requests a limit applies to: path patterns and methods."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ratelimit.asgi.delay import WAITING, WaitingRoom, delay_seconds
from ratelimit.asgi.limits import HTTPCost, HTTPCountWhen, HTTPLimit, HTTPSettle
from ratelimit.asgi.sources import Source
from ratelimit.errors import ConfigurationError
from ratelimit.front.limiter import RateLimit
from ratelimit.rules.tree import RuleLike

LIMITED_VIEW = "LIMITED_VIEW"
"""What a front end's ``templates`` says of a request whose view has a limit of its own
(``@limits.limit`` in Flask, ``@limit`` in Django): ``per_route`` routes leave it to that
limit, as slowapi's and flask-limiter's ``default_limits`` leave decorated routes."""
VIEW_LIMITED = "_ratelimit_view_limited"
"""The attribute the view decorators set on what they return, which :data:`LIMITED_VIEW`
is told by."""
NO_ROUTE = "(no route)"
"""The template of a path no route of the application serves (:meth:`Route.key_for`)."""
_PARAMETER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::(path))?\}")
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT", "WEBSOCKET"}
)


def pattern(path: str, where: str) -> re.Pattern[str]:
    """A path pattern as a regular expression matching whole paths: ``{name}`` is one
    segment, ``{name:path}`` the rest of the path, and a trailing ``*`` anything after."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigurationError(f"{where}: a path pattern starts with '/', not {path!r}")
    glob = path.endswith("*")
    body = path[:-1] if glob else path
    if "*" in body:
        raise ConfigurationError(f"{where}: '*' may only end a path pattern: {path!r}")
    regex, end = [], 0
    for match in _PARAMETER.finditer(body):
        regex.append(re.escape(body[end : match.start()]))
        name, rest = match.groups()
        regex.append(f"(?P<{name}>.*)" if rest else f"(?P<{name}>[^/]+)")
        end = match.end()
    tail = body[end:]
    if "{" in tail or "}" in tail:
        raise ConfigurationError(
            f"{where}: {path!r} has a malformed parameter; write {{name}} or {{name:path}}"
        )
    regex.append(re.escape(tail))
    try:
        return re.compile("".join(regex) + (".*" if glob else ""))
    except re.error as exc:  # a parameter named twice
        raise ConfigurationError(f"{where}: {path!r}: {exc}") from None


def route_methods(
    methods: Iterable[str] | None, where: str
) -> tuple[frozenset[str] | None, frozenset[str] | None]:
    """A route's ``methods=``, checked: the methods named (for its default key), and those
    it applies to (``None``: every one). HEAD runs the GET endpoint (frameworks answer it
    so): it counts as a GET, or a client would read the same page unlimited."""
    if isinstance(methods, str):
        methods = [methods]
    named = None if methods is None else frozenset(m.upper() for m in methods)
    if named is None:
        return None, None
    unknown = sorted(named - METHODS)
    if unknown or not named:
        raise ConfigurationError(
            f"{where}: unknown method {', '.join(unknown) or '(none given)'}; "
            f"methods are {', '.join(sorted(METHODS))}"
        )
    return named, named | {"HEAD"} if "GET" in named else named


def path_match(
    methods: frozenset[str] | None, regex: re.Pattern[str], method: str, path: str
) -> dict[str, str] | None:
    """The path parameters when a route of ``methods`` and ``regex`` applies to a request,
    else ``None``."""
    if methods is not None and method not in methods:
        return None
    found = regex.fullmatch(path)
    return None if found is None else found.groupdict()


class Route:
    """A limit on the requests whose path matches ``path`` (and, when given, whose method is
    one of ``methods``; ``"WEBSOCKET"`` names WebSocket handshakes; ``"GET"`` takes ``HEAD``
    too, which runs the same endpoint).

    ``rules``: as for ``RateLimit.limit``. ``key``: the counters' name (default: the methods
    and the pattern, e.g. ``"GET /ping"``); routes with one key share counters.
    ``**sources``: where each selector's value comes from (see :mod:`ratelimit.asgi.sources`);
    a selector named ``ip`` reads the client address unless given. ``cost``: what one
    request counts: a number, a mapping from units to amounts, or a callable (sync or
    async) of the :class:`~ratelimit.asgi.HTTPRequest` returning one. ``settle``: what it
    really cost, known from the response: a response header's name (``"x-tokens-used"``,
    a number: for rules that count one unit, that unit's amount) or a callable (sync or
    async) of the request and the :class:`~ratelimit.asgi.HTTPResponse` (``None``: the
    reservation stands); settled as the response starts. ``shadow``: decide and report,
    never refuse (default: the limiter's setting). ``delay``: the most seconds a refused
    request may wait for its turn instead of being answered 429 (0 to 60; default 0, none);
    ``waiting``: how many may wait at once, per route and process (default 100); see
    :mod:`ratelimit.asgi.delay`. ``penalty``: hold back a value refused too often, as
    ``RateLimit.limit``'s (``"ip: 5 refusals/10m for 1h"``). ``per_route``: every route of
    the application that this one matches counts on counters of its own, by method and path
    template (``Route("/*", "ip:100/m", per_route=True)``: 100 a minute per ip on each of
    ``GET /items/{id}``, ``POST /items``, ...; slowapi's and flask-limiter's
    ``default_limits``), keyed ``"<key> <METHOD> <template>"``; see :meth:`key_for`.
    ``count_when``: count only the requests whose response it says (flask-limiter's
    ``deduct_when``): the statuses that count (``range(400, 600)``, ``{401}``) or a
    callable (sync or async) of the request and the response returning whether it counts;
    a request that does not is refunded as its response starts.
    Everything is checked here, when the application starts.
    """

    __slots__ = ("key", "limit", "methods", "path", "per_route", "regex", "room")

    def __init__(
        self,
        path: str,
        rules: RuleLike,
        *,
        methods: Iterable[str] | None = None,
        key: str | None = None,
        cost: HTTPCost = 1,
        settle: HTTPSettle | None = None,
        shadow: bool | None = None,
        delay: float = 0,
        waiting: int | None = None,
        penalty: str | None = None,
        per_route: bool = False,
        count_when: HTTPCountWhen | None = None,
        **sources: Any,
    ) -> None:
        where = f"Route({path!r})"
        if not isinstance(per_route, bool):
            raise TypeError(f"{where}: per_route must be True or False, not {per_route!r}")
        self.per_route = per_route
        self.room = room_of(delay, waiting, shadow, where)
        self.path = path
        self.regex = pattern(path, where)
        named, self.methods = route_methods(methods, where)
        self.limit = HTTPLimit(
            rules, key, cost, shadow, sources, where, False, settle, penalty, count_when
        )
        self.key = key or (f"{' '.join(sorted(named))} {path}" if named else path)
        _check_path_params(self.limit.sources, self.regex, where)

    def match(self, method: str, path: str) -> dict[str, str] | None:
        """The path parameters when this route applies to the request, else ``None``."""
        return path_match(self.methods, self.regex, method, path)

    def key_for(self, method: str, template: str | None) -> str:
        """The key a request of ``method`` counts under: :attr:`key`; under ``per_route``,
        followed by the method (``HEAD`` as ``GET``, whose endpoint it runs) and the path
        template of the application's route it reached (``"/* GET /items/{id}"``;
        ``template`` ``None``: a path no route of the application serves, all of which
        share ``"/* GET (no route)"``; a method HTTP does not define counts as ``OTHER``)."""
        if not self.per_route:
            return self.key
        if method == "HEAD":
            method = "GET"
        elif method not in METHODS:  # a client's made-up method: one bucket, not one each
            method = "OTHER"
        return f"{self.key} {method} {template or NO_ROUTE}"

    def __repr__(self) -> str:
        return f"Route({self.path!r}, '{self.limit.compiled.tree}', key={self.key!r})"


def _check_path_params(sources: Mapping[str, Source], regex: re.Pattern[str], where: str) -> None:
    """Every ``path_param(...)`` of a route names a parameter of its pattern: another never
    has a value, and its rule would never limit anything."""
    have = list(regex.groupindex)
    for selector, source in sources.items():
        name = source.path_param
        if name is None or name in have:
            continue
        close = difflib.get_close_matches(name, have, n=1)
        hint = f"; did you mean path_param({close[0]!r})?" if close else ""
        params = f"its parameters: {', '.join(have)}" if have else "it has no parameter"
        raise ConfigurationError(
            f"{where}: {selector}=path_param({name!r}) names no parameter of the route's "
            f"pattern ({params}), so it would never have a value{hint}"
        )


def room_of(
    delay: float, waiting: int | None, shadow: bool | None, where: str
) -> WaitingRoom | None:
    """The waiting room of a route's ``delay=`` and ``waiting=``; ``None`` without a delay."""
    seconds = delay_seconds(delay, where)
    if not seconds:
        if waiting is not None:
            raise ConfigurationError(f"{where}: waiting={waiting!r} needs a delay= to wait")
        return None
    if shadow:
        raise ConfigurationError(f"{where}: delay= with shadow=True: a shadow limit never refuses")
    return WaitingRoom(seconds, WAITING if waiting is None else waiting, where)


def view_key(method: str, name: str) -> str:
    """The default key of a view limit (``RouteLimit``, the Flask and Django view limits):
    ``"view GET /items/{item}"``. The ``view`` keeps it apart from a :class:`Route` on the
    same methods and pattern (``"GET /items/{item}"``), so that a route and a view limit
    counting one selector never count a request twice on one counter."""
    return f"view {method} {name}"


class RouteTable:
    """A middleware's routes and excluded paths, checked when made: what the ASGI and the
    WSGI middleware share. ``routes``: :class:`Route` objects, the first match deciding,
    each checked against ``limiter`` (its cost admissible under its rules); ``exclude``:
    path patterns that never touch the limiter, checked first. Routes may share one
    ``key=`` whatever their rules: each identifier has one counter wherever keys spread."""

    __slots__ = ("exclude", "routes")

    def __init__(self, routes: Sequence[Route], exclude: Iterable[str], limiter: RateLimit) -> None:
        self.routes = tuple(routes)
        for route in self.routes:
            if not isinstance(route, Route):
                raise TypeError(f"routes take ratelimit.asgi.Route objects, not {route!r}")
            route.limit.check(limiter)
        if isinstance(exclude, str):
            exclude = [exclude]
        self.exclude = tuple(pattern(path, "exclude") for path in exclude)

    def excluded(self, path: str) -> bool:
        """Whether ``path`` (as the application routes on it) is excluded."""
        return any(excluded.fullmatch(path) for excluded in self.exclude)

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The first route that matches, with its path parameters (exclusions unchecked)."""
        for route in self.routes:
            params = route.match(method, path)
            if params is not None:
                return route, params
        return None

    def route_for(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The route that decides a request, with its path parameters; ``None`` for
        excluded and unmatched paths."""
        return None if self.excluded(path) else self.match(method, path)
