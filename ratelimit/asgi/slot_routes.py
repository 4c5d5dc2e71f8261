"""``SlotRoute``: at most N requests in flight at the HTTP edge, with slots kept for
critical ones (``rl.concurrency`` for routes).

Given to :class:`~ratelimit.asgi.RateLimitMiddleware` beside its :class:`Route` objects::

    RateLimitMiddleware(app, rl, routes=[
        Route("/*", "ip:100/m"),
        SlotRoute("/reports/*", "100", reserve={"critical": 20},
                  priority=header("x-priority")),
    ])

A request the first matching ``SlotRoute`` applies to holds its slots while the application
handles it: until the application returns (the whole response sent, streamed bodies
included), raises, or the client goes away; a WebSocket holds them while it is open. A
request finding no free slot is answered 429 with the headers of a full concurrency limit,
and its handshake refused, as the middleware answers a ``ConcurrencyLimitExceeded`` raised
inside the application. Slot routes are matched apart from rate routes (the first of each
kind applies), after them: a request the rates refuse takes no slot. Excluded paths take
none either. ``reserve`` and ``priority`` as :meth:`ratelimit.RateLimit.concurrency` and
:mod:`ratelimit.front.reserve` say; the priority is read from the request like any selector
(:mod:`ratelimit.asgi.sources`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

from ratelimit.asgi.proxies import TrustedProxies
from ratelimit.asgi.request import HTTPRequest, route_path
from ratelimit.asgi.routes import RouteTable, path_match, pattern, route_methods
from ratelimit.asgi.sources import Source, _as_source, client_ip, resolve
from ratelimit.core.slots import parse_slots
from ratelimit.errors import ConfigurationError
from ratelimit.front.concurrency import DEFAULT_LEASE, Concurrency
from ratelimit.front.limiter import RateLimit
from ratelimit.front.reserve import DEFAULT_BY, kept_for
from ratelimit.pipeline.waiting import wait_seconds

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class SlotRoute:
    """At most ``slots`` requests at once (``"5"``, per selector value ``"user:5"``, or
    several, ``"user:5 | 100"``) on the paths matching ``path`` (patterns and ``methods`` as
    :class:`~ratelimit.asgi.Route` takes them). ``key``: the slots' name (default: the
    methods and the pattern, as a route's); ``reserve``/``reserve_by``: slots kept for
    critical requests (the priority a source given as ``priority=``, or the selector
    ``reserve_by`` names); ``lease`` and ``wait`` as for ``rl.concurrency``;
    ``**sources``: where each selector's value comes from (``ip`` reads the client address
    unless given). Everything is checked here, when the application starts.
    """

    __slots__ = ("_settings", "key", "limits", "methods", "path", "regex", "sources")

    def __init__(
        self,
        path: str,
        slots: str,
        *,
        methods: Iterable[str] | None = None,
        key: str | None = None,
        reserve: dict[str, int] | None = None,
        reserve_by: str = DEFAULT_BY,
        lease: float = DEFAULT_LEASE,
        wait: float | bool = False,
        **sources: Any,
    ) -> None:
        where = f"SlotRoute({path!r})"
        self.path = path
        self.regex = pattern(path, where)
        self.limits = parse_slots(slots)
        kept = kept_for(reserve, reserve_by, self.limits, where)
        if key is not None and (not isinstance(key, str) or not key):
            raise TypeError(f"{where}: key must be non-empty text, not {key!r}")
        wait_seconds(wait)  # a bad wait fails here (lease: when the middleware is made)
        named, self.methods = route_methods(methods, where)
        self.key = key or (f"{' '.join(sorted(named))} {path}" if named else path)
        names = [limit.selector for limit in self.limits if limit.selector is not None]
        if kept is not None:
            if kept.by not in sources:
                raise ConfigurationError(
                    f"{where}: reserve= keeps slots for priorities {', '.join(kept.caps)} but "
                    f"no source says a request's; pass {kept.by}=header('x-{kept.by}') or "
                    "another source"
                )
            names.append(kept.by)
        extra = sorted(set(sources) - set(names))
        if extra:
            raise ConfigurationError(
                f"{where}: {', '.join(extra)} {'is' if len(extra) == 1 else 'are'} not a "
                f"selector of its slots '{slots}' nor its priority"
            )
        self.sources: dict[str, Source] = {}
        for name in dict.fromkeys(names):
            if name in sources:
                self.sources[name] = _as_source(sources[name], name, where)
            elif name == "ip":
                self.sources[name] = client_ip()
            else:
                raise ConfigurationError(
                    f"{where}: slots '{slots}' select {name!r} but no source was given; pass "
                    f"{name}=header('x-{name}'), query_param({name!r}), path_param({name!r}), "
                    "user() or a function of the request"
                )
            if self.sources[name].needs_body:
                raise ConfigurationError(
                    f"{where}: {name}={self.sources[name]!r} reads the request body, which "
                    "the middleware never buffers"
                )
        self._settings = (reserve, reserve_by, lease, wait)  # for rl.concurrency

    def slots_of(self, limiter: RateLimit) -> Concurrency:
        """Its slots on ``limiter`` (a store holding none fails here)."""
        reserve, reserve_by, lease, wait = self._settings
        return limiter.concurrency(
            ",".join(map(str, self.limits)),
            key=self.key,
            lease=lease,
            wait=wait,
            reserve=reserve,
            reserve_by=reserve_by,
        )

    def match(self, method: str, path: str) -> dict[str, str] | None:
        """The path parameters when this route applies to the request, else ``None``."""
        return path_match(self.methods, self.regex, method, path)

    def __repr__(self) -> str:
        return f"SlotRoute({self.path!r}, '{' | '.join(map(str, self.limits))}', key={self.key!r})"


def with_slot_routes(
    app: ASGIApp,
    limiter: RateLimit,
    routes: Sequence[object],
    table: RouteTable,
    proxies: TrustedProxies,
) -> ASGIApp:
    """``app``, holding the slots of the first :class:`SlotRoute` of ``routes`` that
    matches each request; ``app`` itself when there are none (nothing added per request)."""
    slot_routes = [route for route in routes if isinstance(route, SlotRoute)]
    if not slot_routes:
        return app
    held = [(route, route.slots_of(limiter)) for route in slot_routes]

    async def holding(scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await app(scope, receive, send)
            return
        path = route_path(scope)
        method = "WEBSOCKET" if kind == "websocket" else scope.get("method", "GET")
        found = next(
            ((route, slots, params) for route, slots in held
             if (params := route.match(method, path)) is not None),
            None,
        )  # fmt: skip
        if found is None or table.excluded(path):
            await app(scope, receive, send)
            return
        route, slots, params = found
        request = HTTPRequest(scope, proxies, params)
        names = tuple(route.sources)
        values = await resolve(names, route.sources, request) if names else ()
        async with slots.held_for(route.key, dict(zip(names, values, strict=True))):
            await app(scope, receive, send)

    return holding
