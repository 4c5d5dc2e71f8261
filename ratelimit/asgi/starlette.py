"""``RouteLimit``: a limit on one route of a FastAPI or Starlette application, with
selectors from headers, the JSON body or the authenticated user.

FastAPI::

    login_limit = RouteLimit(rl, "username:3/m", username=json_field("username"))

    @app.post("/login", dependencies=[Depends(login_limit)])
    async def login(body: Login) -> dict[str, str]: ...

Starlette (no dependency injection): ``decision = await login_limit.check(request)`` at the
top of the endpoint.

The decision is returned (``decision: Decision = Depends(login_limit)``) and kept on
``request.state.ratelimit``. With :class:`~ratelimit.asgi.RateLimitMiddleware` installed (its
routes may be empty), the response carries the ``RateLimit`` headers and a refusal is the
middleware's 429; without it, a refusal is raised as Starlette's ``HTTPException`` (429, or
503 under ``on_error="deny"``) with the same headers, and admitted responses carry none. A
selector value its source's ``type`` cannot read is a 422 the same way (the middleware's
problem details, else an ``HTTPException``), counted nowhere.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ratelimit.core.extras import needs_extra

with needs_extra("asgi"):
    from starlette.exceptions import HTTPException
    from starlette.requests import HTTPConnection, Request

from ratelimit.asgi.headers import problem, rate_limit_headers, refusal_headers, unreadable
from ratelimit.asgi.limits import HTTPCost, HTTPLimit
from ratelimit.asgi.middleware import DECISIONS, STATE
from ratelimit.asgi.proxies import TrustedProxies
from ratelimit.asgi.request import HTTPRequest
from ratelimit.asgi.routes import room_of, view_key
from ratelimit.core.decision import Decision, RateLimitExceeded
from ratelimit.errors import SourceValueError
from ratelimit.front.limiter import RateLimit
from ratelimit.rules.tree import RuleLike

logger = logging.getLogger("ratelimit.asgi")


class RouteLimit:
    """A limit for one route, checked when made. ``rules``, ``key`` and ``shadow`` as for
    ``RateLimit.limit``, ``cost`` as for :class:`~ratelimit.asgi.Route` (a callable gets
    the :class:`~ratelimit.asgi.HTTPRequest`; a dependency cannot see the response: settle
    in the endpoint with ``await rl.settle(request.state.ratelimit, actual)``, or give the
    route's ``settle=`` to the middleware) (``key`` defaults to ``view``, the method and the
    route's path template within its application, e.g. ``"view POST /login"``, the same
    under ``root_path`` or a mount; never a middleware ``Route``'s default key, so the two
    never count on one counter unless given one ``key``); ``**sources`` as for
    :class:`~ratelimit.asgi.Route`, body fields included; ``trusted_proxies``,
    ``forwarded_header`` and ``ipv6_prefix`` as for the middleware (a selector named ``ip``
    reads the client); ``penalty`` as for ``RateLimit.limit``; ``delay`` and ``waiting``
    as for :class:`~ratelimit.asgi.Route` (a dependency cannot hear its client leave while
    it waits: the application reads the request)."""

    def __init__(
        self,
        limiter: RateLimit,
        rules: RuleLike,
        *,
        key: str | None = None,
        cost: HTTPCost = 1,
        shadow: bool | None = None,
        penalty: str | None = None,
        trusted_proxies: Iterable[str] = (),
        forwarded_header: str = "x-forwarded-for",
        ipv6_prefix: int = 64,
        delay: float = 0,
        waiting: int | None = None,
        **sources: Any,
    ) -> None:
        where = f"RouteLimit({rules!r})"
        self.room = room_of(delay, waiting, shadow, where)
        self.limit = HTTPLimit(rules, key, cost, shadow, sources, where, True, None, penalty)
        self.limit.check(limiter)
        self.limiter = limiter
        self.proxies = TrustedProxies(trusted_proxies, ipv6_prefix, forwarded_header)
        self._warned = False

    async def __call__(self, request: Request) -> Decision:
        return await self.check(request)

    async def check(self, request: HTTPConnection) -> Decision:
        """Decide ``request``: return the decision when admitted (or in shadow mode), else
        raise (see the module's documentation)."""
        scope = request.scope
        body = request.json if isinstance(request, Request) else None
        view = HTTPRequest(scope, self.proxies, body=body)
        key = self.limit.key or _route_key(request, self.limit.compiled.tree)
        decisions = scope.get(DECISIONS)
        try:
            if self.room is None:
                decision = await self.limit.decide(self.limiter, view, key)
            else:  # delay=: a refused request may wait its turn
                decision = await self.room.held(self.limiter, self.limit, key, view)
        except SourceValueError as exc:
            if decisions is not None:
                raise  # the middleware answers it
            status, body_bytes = unreadable(exc)
            raise HTTPException(status, detail=body_bytes.decode()) from exc
        setattr(request.state, STATE, decision)
        if decisions is not None:
            decisions.append(decision)
        if decision.allowed or decision.shadow:
            if decisions is None and not self._warned:
                self._warned = True
                logger.warning(
                    "ratelimit: RouteLimit works without RateLimitMiddleware, but admitted "
                    "responses carry no RateLimit headers; add the middleware (routes=[] is "
                    "fine) to send them"
                )
            return decision
        if decisions is not None:
            raise RateLimitExceeded(decision)  # the middleware answers it
        status, body_bytes = problem(decision)
        headers = refusal_headers(decision, body_bytes)[2:] + rate_limit_headers([decision])
        raise HTTPException(
            status,
            detail=body_bytes.decode(),
            headers={name.decode(): value.decode() for name, value in headers},
        )


def _route_key(request: HTTPConnection, rules: object) -> str:
    """``view``, the method and what names the route, never the path a client asked for
    (which it can vary at will: ``/items/1``, ``/items/2``): the route's path template
    (``"view POST /login"``; Starlette and FastAPI set ``scope["route"]``, within the
    application that holds it, so neither ``root_path`` nor a mount's prefix enters it),
    else its endpoint's qualified name (Starlette versions that set only
    ``scope["endpoint"]``), else the rules themselves (:func:`~ratelimit.asgi.routes.view_key`).
    ``HEAD`` counts as ``GET``."""
    scope = request.scope
    method = scope.get("method", "WEBSOCKET")
    if method == "HEAD":  # the GET endpoint's answer, without its body: the GET's counters
        method = "GET"
    path = getattr(scope.get("route"), "path", None)
    if path:
        return view_key(method, path)
    endpoint = scope.get("endpoint")
    name = getattr(endpoint, "__qualname__", None)
    if name:
        return view_key(method, f"{getattr(endpoint, '__module__', '')}.{name}")
    return view_key(method, str(rules))
