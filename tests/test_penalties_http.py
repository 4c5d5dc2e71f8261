"""Penalties at the HTTP edge (ASGI middleware ``Route(penalty=...)`` and a route
dependency ``RouteLimit(penalty=...)``): ``Retry-After`` is the hold's time left, and the
problem+json body says the client is held back."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

from ratelimit import ConfigurationError, MemoryBackend, RateLimit
from ratelimit.asgi import RateLimitMiddleware, Route, RouteLimit
from tests.conftest import FailingBackend, FakeClock

pytestmark = pytest.mark.timeout(30)

PENALTY = "3 refusals/m for 10m"


def client(app: Any, peer: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 4000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def app_with(rl: RateLimit, routes: list[Route]) -> Starlette:
    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[StarletteRoute("/{path:path}", ok, methods=["GET", "POST"])])
    app.add_middleware(RateLimitMiddleware, limiter=rl, routes=routes)
    return app


def test_checked_when_made() -> None:
    with pytest.raises(ConfigurationError, match="do not name"):
        Route("/login", "ip:1/m", penalty="user: 3 refusals/m for 10m")
    with pytest.raises(ValueError, match="column"):
        Route("/login", "ip:1/m", penalty="3 refusals/m")
    rl = RateLimit(FailingBackend())
    with pytest.raises(ConfigurationError, match="keeps no penalties"):
        RateLimitMiddleware(app_with(rl, []), rl, [Route("/x", "ip:1/m", penalty=PENALTY)])
    with pytest.raises(ConfigurationError, match="keeps no penalties"):
        RouteLimit(rl, "ip:1/m", penalty=PENALTY)


async def test_middleware_holds_back_a_client(clock: FakeClock) -> None:
    rl = RateLimit(MemoryBackend(clock=clock))
    app = app_with(rl, [Route("/login", "ip:1/m", methods=["POST"], penalty=PENALTY)])
    async with client(app, "198.51.100.7") as bad, client(app, "198.51.100.8") as good:
        statuses = [(await bad.post("/login")).status_code for _ in range(3)]
        assert statuses == [200, 429, 429]
        clock.advance(30)
        started = await bad.post("/login")  # the third refusal within a minute
        assert started.status_code == 429
        assert started.headers["retry-after"] == "600"
        clock.advance(100)  # the rules would admit now; the hold does not
        held = await bad.post("/login")
        assert held.status_code == 429
        assert held.headers["retry-after"] == "500"
        assert held.headers["content-type"] == "application/problem+json"
        body = json.loads(held.text)
        assert body["penalty"] == 500
        assert "held back for 500 s after 3 refusals within 1m" in body["detail"]
        assert "ratelimit" not in held.headers  # no rule was asked: no RateLimit fields
        assert (await good.post("/login")).status_code == 200
        clock.advance(501)
        assert (await bad.post("/login")).status_code == 200
    await rl.aclose()


async def test_route_dependency_holds_back_a_client(clock: FakeClock) -> None:
    rl = RateLimit(MemoryBackend(clock=clock))
    limit = RouteLimit(rl, "ip:1/m", key="login", penalty=PENALTY)

    async def login(request: Request) -> PlainTextResponse:
        await limit.check(request)
        return PlainTextResponse("ok")

    app = Starlette(routes=[StarletteRoute("/login", login, methods=["POST"])])
    async with client(app, "198.51.100.9") as bad:
        statuses = [(await bad.post("/login")).status_code for _ in range(4)]
        assert statuses == [200, 429, 429, 429]
        held = await bad.post("/login")
        assert held.headers["retry-after"] == "600"
        assert json.loads(held.text)["penalty"] == 600
    await rl.aclose()
