"""``RateLimitMiddleware``: the ASGI middleware's limits for any PEP 3333 application (Flask,
Django, Bottle, Pyramid, plain WSGI), on the synchronous limiter.

Per request, as :class:`ratelimit.asgi.RateLimitMiddleware` does: excluded paths pass
untouched; otherwise the **first** :class:`~ratelimit.asgi.Route` that matches the method
and path (``PATH_INFO``: the path without ``SCRIPT_NAME``) decides, through the limiter's
one door. A refused request never reaches the application: it gets a 429 with
``Retry-After`` and problem details (or 503 when the storage failed and
``on_error="deny"``); a selector value its ``type`` cannot read gets 422. Every response
the limiter decided carries ``RateLimit-Policy`` / ``RateLimit``, added as the application
calls ``start_response``; a route with ``settle=`` settles from the status and headers given
there. The body streams through untouched.

A ``RateLimitExceeded`` the application raises (a ``@rl.limit`` function of
:mod:`ratelimit.sync` called by a view) becomes the same 429 while no body has been sent,
whether it is raised by the call or while its body is produced.

Framework-free: routes, sources, client addresses and the header fields are the ASGI
package's (:mod:`ratelimit.asgi`); :mod:`ratelimit.wsgi.environ` gives them a WSGI request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from ratelimit.asgi.headers import (
    problem,
    rate_limit_headers,
    refusal_headers,
    undecided,
    unreadable,
)
from ratelimit.asgi.limits import HTTPLimit
from ratelimit.asgi.proxies import TrustedProxies
from ratelimit.asgi.request import HTTPRequest, route_path
from ratelimit.asgi.routes import LIMITED_VIEW, Route, RouteTable
from ratelimit.core.decision import Decision
from ratelimit.core.slots import SlotLimit
from ratelimit.errors import ConfigurationError, SourceValueError
from ratelimit.front.limiter import RateLimit as AsyncRateLimit
from ratelimit.sync.limiter import RateLimit
from ratelimit.wsgi.environ import routed, scope_of
from ratelimit.wsgi.response import Exchange, ExcInfo, answer, as_text

Refused: TypeAlias = Callable[[HTTPRequest, Decision], WSGIApplication]

DECISIONS = "ratelimit.decisions"
"""Environ key of the list of decisions made for one request (the middleware's, and any the
application adds), read when the response starts."""
STATE = "ratelimit.decision"
"""Environ key of the route's decision (absent when no route decided)."""


@dataclass(slots=True)
class Gate:
    """One request past the routes: its view for sources, the decisions made for it (the
    route's, and any a view adds), and what came of the route's: ``refused`` (its refused
    decision), ``unreadable`` (a selector value its source could not read), ``settle``
    (the route's limit, when it settles from the response)."""

    request: HTTPRequest
    decisions: list[Decision]
    refused: Decision | None = None
    unreadable: SourceValueError | None = None
    settle: HTTPLimit | None = None


class RateLimitMiddleware:
    """Limit a WSGI application's requests by route.

    ``limiter``: the :class:`ratelimit.sync.RateLimit` that counts. The other arguments are
    :class:`ratelimit.asgi.RateLimitMiddleware`'s: ``routes`` (:class:`~ratelimit.asgi.Route`
    limits, the first match deciding), ``exclude`` (path patterns that never touch the
    limiter), ``trusted_proxies``, ``forwarded_header`` and ``ipv6_prefix`` (see
    :class:`~ratelimit.asgi.TrustedProxies`; by default the client is ``REMOTE_ADDR``),
    ``headers`` and ``legacy_headers``. ``refused``: a function of (request, decision)
    returning the WSGI application that answers a 429 (default: RFC 9457 problem details).
    ``templates``: a function of the environ returning the path template of the route it
    reaches (``None`` for none; :data:`~ratelimit.asgi.routes.LIMITED_VIEW` for a view with
    a limit of its own, which ``per_route`` routes leave alone), which
    ``Route(..., per_route=True)`` counts by (``ratelimit.flask`` and ``ratelimit.django``
    pass their router's; without it, a ``per_route`` route is refused). Everything is
    checked here.

    Example (Flask)::

        from ratelimit.sync import RateLimit
        from ratelimit.wsgi import RateLimitMiddleware, Route

        rl = RateLimit.from_url("redis://localhost:6379")
        app.wsgi_app = RateLimitMiddleware(
            app.wsgi_app, rl, [Route("/login", "ip:5/m", methods=["POST"])], exclude=["/health"]
        )
    """

    def __init__(
        self,
        app: WSGIApplication,
        limiter: RateLimit,
        routes: Sequence[Route] = (),
        *,
        exclude: Iterable[str] = (),
        trusted_proxies: Iterable[str] = (),
        forwarded_header: str = "x-forwarded-for",
        ipv6_prefix: int = 64,
        headers: bool = True,
        legacy_headers: bool = False,
        refused: Refused | None = None,
        templates: Callable[[WSGIEnvironment], str | None] | None = None,
    ) -> None:
        check_limiter(limiter, "RateLimitMiddleware")
        if templates is not None and not callable(templates):
            raise TypeError(f"templates must be a function of the environ, not {templates!r}")
        self.templates = templates
        """The path template of a request's route, for ``per_route`` routes (Flask's and
        Django's pass their router's; ``None``: each path counts on its own)."""
        if not callable(app):
            raise TypeError(f"app must be a WSGI application (a callable), not {app!r}")
        if refused is not None and not callable(refused):
            raise TypeError(f"refused must be a function of (request, decision), not {refused!r}")
        self.app = app
        self.limiter = limiter
        self.table = RouteTable(routes, exclude, limiter.limiter)
        if templates is None and any(route.per_route for route in self.table.routes):
            raise ConfigurationError(
                "per_route=True needs the application's path templates: pass templates= (a "
                "function of the environ returning the template of the route it reaches), or "
                "use ratelimit.flask or ratelimit.django, which read their router's"
            )
        for route in self.table.routes:
            if route.room is not None:
                raise ConfigurationError(
                    f"{route!r}: delay= is the ASGI middleware's (a request waiting here would "
                    "hold a WSGI worker thread): drop it, or serve the application over ASGI"
                )
        self.routes = self.table.routes
        self.exclude = self.table.exclude
        self.proxies = TrustedProxies(trusted_proxies, ipv6_prefix, forwarded_header)
        self.headers = bool(headers)
        self.legacy_headers = bool(legacy_headers)
        self.refused = refused

    def route_for(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The route that decides a request (the first that matches), with its path
        parameters; ``None`` for excluded and unmatched paths. ``path``: ``PATH_INFO``."""
        return self.table.route_for(method, path)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        gate = self.gate(environ)
        if gate is None:
            return self.app(environ, start_response)
        if gate.unreadable is not None:
            return answer(start_response, *unreadable(gate.unreadable))
        if gate.refused is not None:
            return self.refuse(environ, start_response, gate.request, gate.refused, gate.decisions)
        exchange = Exchange(self, environ, start_response, gate.request, gate.decisions)
        exchange.settle = gate.settle
        return exchange.run()

    def gate(self, environ: WSGIEnvironment) -> Gate | None:
        """The route's decision on one request (``None`` for an excluded path): what this
        middleware and the Django one (:mod:`ratelimit.django`) both do first. Sets
        ``environ[DECISIONS]`` (and ``environ[STATE]`` when a route decided)."""
        scope = scope_of(environ)
        path = routed(route_path(scope))
        if self.table.excluded(path):
            return None
        decisions: list[Decision] = []
        environ[DECISIONS] = decisions
        found = self.table.match(scope["method"], path)
        request = HTTPRequest(scope, self.proxies, None if found is None else found[1])
        gate = Gate(request, decisions)
        if found is not None:
            route = found[0]
            key = route.key
            if route.per_route and self.templates is not None:
                template = self.templates(environ)
                if template == LIMITED_VIEW:  # its view has a limit of its own
                    return gate
                key = route.key_for(scope["method"], template)
            try:
                decision = self.limiter.run(
                    lambda limiter: route.limit.decide(limiter, request, key)
                )
            except SourceValueError as exc:
                gate.unreadable = exc
                return gate
            decisions.append(decision)
            environ[STATE] = decision
            if not decision.allowed and not decision.shadow:
                gate.refused = decision
            elif route.limit.settles:
                gate.settle = route.limit
        return gate

    def headers_for(
        self, decisions: Sequence[Decision], full: SlotLimit | None = None
    ) -> list[tuple[str, str]]:
        """The rate-limit headers of a response these decisions decided (none when off)."""
        if not self.headers or not decisions:
            return []
        return as_text(rate_limit_headers(decisions, self.legacy_headers, full))

    def refuse(
        self,
        environ: WSGIEnvironment,
        start_response: StartResponse,
        request: HTTPRequest,
        decision: Decision,
        decisions: Sequence[Decision],
        full: SlotLimit | None = None,
        exc_info: ExcInfo = None,
    ) -> Iterable[bytes]:
        """The answer to a refused request: the ``refused`` application's, or problem
        details (always for a 503), with the rate-limit headers. ``exc_info``: given when
        the application had started a response that this one replaces."""
        added = self.headers_for(decisions, full)
        if self.refused is not None and not undecided(decision):
            application = self.refused(request, decision)
            retry = as_text(refusal_headers(decision, b"")[2:])

            def start_with_headers(
                status: str, headers: list[tuple[str, str]], info: ExcInfo = None
            ) -> Callable[[bytes], object]:
                headers = [*headers, *added]
                if all(name.lower() != "retry-after" for name, _ in headers):
                    headers += retry
                return start_response(status, headers, info or exc_info)

            return application(environ, start_with_headers)
        status, body = problem(decision)
        retry = as_text(refusal_headers(decision, body)[2:])
        return answer(start_response, status, body, [*retry, *added], exc_info)


def check_limiter(limiter: object, where: str) -> None:
    """Raise ``TypeError`` unless ``limiter`` is a :class:`ratelimit.sync.RateLimit` (the one
    a view limit of threaded code takes), saying so, and naming the async one if given."""
    if not isinstance(limiter, RateLimit):
        kind = type(limiter)
        what = (
            "ratelimit.RateLimit, the async one, which is for async code (ratelimit.asgi)"
            if isinstance(limiter, AsyncRateLimit)
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        raise TypeError(
            f"{where}: limiter must be a ratelimit.sync.RateLimit (threaded code), not {what}"
        )
