"""``RateLimitMiddleware``: plain ASGI, under Starlette, FastAPI or any ASGI application.

Per request: excluded paths pass untouched; otherwise the **first** route that matches the
method and path decides (one rule tree, atomically; routes with one key share counters).
Paths are matched as the application routes on them, without ``root_path`` (as Starlette
does), so under ``uvicorn --root-path`` or a mount the patterns are the application's own. A
refused request gets a 429 (or 503 when the storage failed and
``on_error="deny"``), a WebSocket handshake is refused before it is accepted, and every
response the limiter decided carries the ``RateLimit-Policy`` / ``RateLimit`` headers. The
body streams through untouched: nothing is buffered. A route with ``settle=`` settles its
request from the response once its start is sent (the headers it reports are those of the
decision, before the settle).

Limits decided inside the application (a :class:`~ratelimit.asgi.RouteLimit` dependency, a
``@rl.limit`` function the route calls) reach the same headers, and their
``RateLimitExceeded`` becomes the same 429 when the response has not started. A selector
value its source's ``type`` cannot read is answered 422 with problem details, counted nowhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

from ratelimit.asgi.header_map import HeaderMap
from ratelimit.asgi.headers import (
    problem,
    problem_headers,
    rate_limit_headers,
    refusal_headers,
    undecided,
    unreadable,
)
from ratelimit.asgi.limits import HTTPResponse, check_async_limiter
from ratelimit.asgi.proxies import TrustedProxies
from ratelimit.asgi.request import HTTPRequest, route_path
from ratelimit.asgi.routes import Route, RouteTable
from ratelimit.asgi.slot_routes import SlotRoute, with_slot_routes
from ratelimit.asgi.templates import RouteTemplates
from ratelimit.core.decision import Decision, RateLimitExceeded
from ratelimit.core.slots import SlotLimit
from ratelimit.errors import SourceValueError
from ratelimit.front.limiter import RateLimit

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Refused = Callable[[HTTPRequest, Decision], ASGIApp]

DECISIONS = "ratelimit.decisions"
"""Scope key of the list of decisions made for one request (the middleware's and any the
application adds), read when the response starts."""
STATE = "ratelimit"
"""Name under ``request.state`` (``scope["state"]``) of the route's decision."""


class RateLimitMiddleware:
    """Limit an ASGI application's requests by route.

    ``limiter``: the :class:`~ratelimit.RateLimit` that counts. ``routes``: :class:`Route`
    limits, the first match deciding. ``exclude``: path patterns that never touch the
    limiter (health checks, metrics), checked first. ``routes`` may hold
    :class:`~ratelimit.asgi.SlotRoute` objects too: slots a request holds while it runs
    (see there). ``trusted_proxies``: the addresses or
    networks (``"unix"`` for a unix socket's peer, ``"*"`` for any peer) whose forwarding
    header names the client (default: none; the client is the connection's peer);
    ``forwarded_header``: the one header those proxies set, ``"x-forwarded-for"`` (default),
    ``"forwarded"`` or ``"x-real-ip"``; ``ipv6_prefix``: IPv6 clients counted per network of
    that many bits (default 64). See :class:`~ratelimit.asgi.TrustedProxies`. ``headers``:
    send ``RateLimit-Policy`` and ``RateLimit`` (default on); ``legacy_headers``: also
    ``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset`` (seconds). ``refused``: a function
    of (request, decision) returning the ASGI response for a 429 (default: RFC 9457 problem
    details).
    """

    def __init__(
        self,
        app: ASGIApp,
        limiter: RateLimit,
        routes: Sequence[Route | SlotRoute] = (),
        *,
        exclude: Iterable[str] = (),
        trusted_proxies: Iterable[str] = (),
        forwarded_header: str = "x-forwarded-for",
        ipv6_prefix: int = 64,
        headers: bool = True,
        legacy_headers: bool = False,
        refused: Refused | None = None,
    ) -> None:
        check_async_limiter(limiter)
        self.app = app
        self.limiter = limiter
        routes = tuple(routes)
        rates = [route for route in routes if not isinstance(route, SlotRoute)]
        self.table = RouteTable(rates, exclude, limiter)
        self.routes = self.table.routes
        self.exclude = self.table.exclude
        self.proxies = TrustedProxies(trusted_proxies, ipv6_prefix, forwarded_header)
        self.templates = RouteTemplates(app)
        """The path template of a request's route, for ``per_route`` routes."""
        self.app = with_slot_routes(app, limiter, routes, self.table, self.proxies)
        self.headers = bool(headers)
        self.legacy_headers = bool(legacy_headers)
        self.refused = refused

    def route_for(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The route that decides a request (the first that matches), with its path
        parameters; ``None`` for excluded and unmatched paths. ``path``: as the application
        routes on it (without ``root_path``)."""
        return self.table.route_for(method, path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        if self.table.excluded(path):
            await self.app(scope, receive, send)
            return
        decisions: list[Decision] = []
        scope = {**scope, DECISIONS: decisions}
        method = "WEBSOCKET" if kind == "websocket" else scope.get("method", "GET")
        found = self.table.match(method, path)
        request = None
        if found is not None:
            route, params = found
            request = HTTPRequest(scope, self.proxies, params)
            key = route.key_for(method, self.templates(scope)) if route.per_route else route.key
            try:
                if route.room is None:
                    decision = await route.limit.decide(self.limiter, request, key)
                else:  # delay=: a refused request may wait its turn
                    held, receive = await route.room.decided(
                        self.limiter, route.limit, key, request, receive
                    )
                    if held is None:
                        return  # the client left while it waited
                    decision = held
            except SourceValueError as exc:
                await _answer(scope, receive, send, *unreadable(exc))
                return
            decisions.append(decision)
            state = scope["state"] = dict(scope.get("state") or {})
            state[STATE] = decision
            if not decision.allowed and not decision.shadow:
                await self._refuse(scope, receive, send, request, decision, decisions)
                return
        if kind == "websocket":
            await self._websocket(scope, receive, send, request, decisions)
            return
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                answered = message
                if self.headers and decisions:
                    added = rate_limit_headers(decisions, self.legacy_headers)
                    if added:
                        message = {**message, "headers": [*message.get("headers", ()), *added]}
                await send(message)
                if found is not None and request is not None and found[0].limit.settles:
                    # the real cost, from the response as the application started it
                    response = HTTPResponse.of(answered)
                    await found[0].limit.settled(self.limiter, request, response, decisions[0])
                return
            await send(message)

        try:
            try:
                await self.app(scope, receive, send_with_headers)
            except Exception as exc:
                if not started and found is not None and request is not None:
                    await self._settle_raised(found[0], request, decisions[0], exc)
                raise
        except SourceValueError as exc:  # a RouteLimit's value is unreadable
            if started:
                raise
            await _answer(scope, receive, send, *unreadable(exc))
        except RateLimitExceeded as exc:  # a limit inside the application refused
            if started:
                raise
            if all(d is not exc.decision for d in decisions):
                decisions.append(exc.decision)
            request = request or HTTPRequest(scope, self.proxies)
            full = getattr(exc, "limit", None)  # a concurrency limit's full slots
            await self._refuse(scope, receive, send, request, exc.decision, decisions, full)

    async def _settle_raised(
        self, route: Route, request: HTTPRequest, decision: Decision, exc: Exception
    ) -> None:
        """A request whose application raised before its response started, settled as
        the status that will answer it (``count_when``: a 500 counts as one)."""
        if route.limit.settles:
            response = HTTPResponse(_STATUS_OF.get(type(exc), 500), HeaderMap(()))
            await route.limit.settled(self.limiter, request, response, decision)

    async def _websocket(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request: HTTPRequest | None,
        decisions: list[Decision],
    ) -> None:
        """A handshake the route admitted (or no route limits): a limit inside the
        application that refuses before the socket is accepted refuses the handshake."""
        connected = accepted = False

        async def receive_noting() -> Message:
            nonlocal connected
            message = await receive()
            connected = connected or message["type"] == "websocket.connect"
            return message

        async def send_noting(message: Message) -> None:
            nonlocal accepted
            accepted = accepted or message["type"] in ("websocket.accept", "websocket.close")
            await send(message)

        try:
            await self.app(scope, receive_noting, send_noting)
        except (RateLimitExceeded, SourceValueError) as exc:
            if accepted:
                raise
            replay = _replaying({"type": "websocket.connect"}, receive) if connected else receive
            if isinstance(exc, SourceValueError):
                await _answer(scope, replay, send, *unreadable(exc))
                return
            if all(d is not exc.decision for d in decisions):
                decisions.append(exc.decision)
            request = request or HTTPRequest(scope, self.proxies)
            await self._refuse(scope, replay, send, request, exc.decision, decisions)

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request: HTTPRequest,
        decision: Decision,
        decisions: list[Decision],
        full: SlotLimit | None = None,
    ) -> None:
        added = rate_limit_headers(decisions, self.legacy_headers, full) if self.headers else []
        if scope["type"] == "websocket":
            status, body = problem(decision)
            retry = refusal_headers(decision, body)[2:]
            await _answer(scope, receive, send, status, body, [*retry, *added])
            return
        if self.refused is not None and not undecided(decision):
            response = self.refused(request, decision)

            async def send_with_headers(message: Message) -> None:
                if message["type"] == "http.response.start":
                    headers = [*message.get("headers", ()), *added]
                    if all(name.lower() != b"retry-after" for name, _ in headers):
                        headers += refusal_headers(decision, b"")[2:]  # Retry-After
                    message = {**message, "headers": headers}
                await send(message)

            await response(scope, receive, send_with_headers)
            return
        status, body = problem(decision)
        retry = refusal_headers(decision, body)[2:]
        await _answer(scope, receive, send, status, body, [*retry, *added])


_STATUS_OF: dict[type[BaseException], int] = {SourceValueError: 422, RateLimitExceeded: 429}
"""The status the middleware answers an exception of the application with (else 500)."""


async def _answer(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    body: bytes,
    added: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answer with a problem: ``status``, ``body``, and ``added`` headers after the content
    headers. A WebSocket handshake is refused before it is accepted: with that answer where
    the server offers ASGI's ``websocket.http.response`` extension (uvicorn does), else by
    closing with 1008 (policy violation), which the server answers with 403."""
    headers = [*problem_headers(body), *added]
    if scope["type"] != "websocket":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    reason = "invalid request" if status == 422 else "rate limit exceeded"
    await send({"type": "websocket.close", "code": 1008, "reason": reason})


def _replaying(first: Message, receive: Receive) -> Receive:
    """``receive``, giving ``first`` once before the messages still to come."""
    pending = [first]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
