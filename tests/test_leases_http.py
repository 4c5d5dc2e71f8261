"""Leases at the HTTP edge: the middleware's routes leased (``RateLimit(..., lease=)``)
admit exactly their limit, answer with the draft-11 headers of each rule, and refund what
``count_when`` does not count, against the lease."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as Endpoint

from ratelimit import MemoryBackend, RateLimit
from ratelimit.asgi import RateLimitMiddleware, Route
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan
from tests.conftest import FakeClock

pytestmark = pytest.mark.timeout(60)


class Counting(MemoryBackend):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.asked = 0

    async def decide(self, plan: Plan) -> Decision:
        self.asked += 1
        return await super().decide(plan)


def _app(rl: RateLimit, routes: list[Route]) -> Starlette:
    async def login(request: Request) -> PlainTextResponse:
        ok = request.query_params.get("password") == "right"
        return PlainTextResponse("ok" if ok else "no", status_code=200 if ok else 401)

    async def search(request: Request) -> PlainTextResponse:
        return PlainTextResponse("found")

    app = Starlette(
        routes=[Endpoint("/login", login, methods=["POST"]), Endpoint("/search", search)]
    )
    app.add_middleware(RateLimitMiddleware, limiter=rl, routes=routes)
    return app


def _client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


async def test_a_leased_route_admits_exactly_its_limit_with_its_headers() -> None:
    clock = FakeClock()
    store = Counting(clock)
    rl = RateLimit(store, "http", lease=0.05)
    app = _app(rl, [Route("/search", "ip:300/m | ip:1000/h")])
    async with _client(app) as http:

        async def client() -> list[httpx.Response]:
            return [await http.get("/search") for _ in range(25)]

        answers = [
            r for batch in await asyncio.gather(*(client() for _ in range(16))) for r in batch
        ]
    codes = [r.status_code for r in answers]
    assert codes.count(200) == 300
    assert codes.count(429) == 100
    assert store.asked < 300  # most answered from leases
    admitted = next(r for r in answers if r.status_code == 200)
    policy = '"ip:300/m";q=300;w=60, "ip:1000/h";q=1000;w=3600'
    assert admitted.headers["ratelimit-policy"] == policy
    assert "ratelimit" in admitted.headers
    refused = next(r for r in answers if r.status_code == 429)
    assert int(refused.headers["retry-after"]) > 0
    await rl.aclose()


async def test_count_when_refunds_a_leased_request_to_its_lease() -> None:
    clock = FakeClock()
    store = Counting(clock)
    rl = RateLimit(store, "http", lease=0.05)
    app = _app(rl, [Route("/login", "ip:40/m", methods=["POST"], count_when={401})])
    async with _client(app) as http:
        right = [await http.post("/login?password=right") for _ in range(200)]
        assert all(r.status_code == 200 for r in right)  # each refunded: counts nothing
        wrong = [await http.post("/login?password=wrong") for _ in range(41)]
    assert [r.status_code for r in wrong].count(401) == 40
    assert wrong[-1].status_code == 429
    await rl.aclose()


async def test_an_override_takes_effect_at_the_next_call_under_leases() -> None:
    """An override lowering a leased limit: the calls after it are decided by its rules
    (a lease of their own), never past them; what the old rules' lease still held comes
    back when it ends (here, given back at once), and the total is then exactly the
    override's."""
    clock = FakeClock()
    store = Counting(clock)
    rl = RateLimit(store, "http", lease=0.05, override_refresh=0)
    limit = rl.limit("apikey:1000/m", key="search", apikey="abc")
    assert sum([(await limit.decide()).allowed for _ in range(100)]) == 100
    await rl.overrides.set("search", "apikey:150/m", apikey="abc")
    after = [await limit.decide() for _ in range(100)]
    assert all(d.override for d in after)
    assert 100 + sum(d.allowed for d in after) <= 150
    await rl.storage.give_back()  # type: ignore[attr-defined]  # the old lease's hold over
    clock.advance(0.06)  # and the refusals held as long as a lease
    more = [await limit.decide() for _ in range(100)]
    assert 100 + sum(d.allowed for d in after) + sum(d.allowed for d in more) == 150
    await rl.aclose()
