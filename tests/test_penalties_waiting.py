"""Penalties meet waiting: a call that waits its turn (``wait=``, ``acquire(wait)``, an
HTTP route's ``delay=``) counts towards its penalty once at most, its last refusal when it
is refused in the end; a call that waits and is admitted counts none. Waits run in an event
loop whose clock is its own (``run_virtual``): no real sleeping."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

from ratelimit import MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.asgi import RateLimitMiddleware, Route
from tests.conftest import run_virtual

pytestmark = pytest.mark.timeout(30)


def test_a_call_that_waits_and_is_admitted_counts_no_refusal() -> None:
    async def main() -> list[bool]:
        rl = RateLimit(MemoryBackend(clock=asyncio.get_running_loop().time), "w")
        limit = rl.limit("1/s", key="k", wait=5, penalty="2 refusals/m for 1h")
        admitted = []

        @limit
        async def work() -> None:
            admitted.append(True)

        for _ in range(4):  # each after the first waits about a second, then is admitted
            await work()
        assert await rl.penalties.list() == []
        await rl.aclose()
        return admitted

    assert run_virtual(main) == [True] * 4


def test_acquire_that_waits_counts_no_refusal_but_its_last() -> None:
    async def main() -> None:
        rl = RateLimit(MemoryBackend(clock=asyncio.get_running_loop().time), "w")
        limit = rl.limit("1/s", key="k", penalty="2 refusals/m for 1h")
        for _ in range(3):
            assert (await limit.acquire(5)).allowed
        assert await rl.penalties.list() == []
        with pytest.raises(RateLimitExceeded) as first:  # refused in the end: counts once
            await limit.acquire(0.1)
        assert first.value.decision.penalty is None
        with pytest.raises(RateLimitExceeded) as second:  # the second refusal: held
            await limit.acquire(0.1)
        assert second.value.decision.penalty == pytest.approx(3600)
        await rl.aclose()

    run_virtual(main)


def test_a_wait_refused_in_the_end_counts_its_last_refusal() -> None:
    async def main() -> None:
        rl = RateLimit(MemoryBackend(clock=asyncio.get_running_loop().time), "w")
        limit = rl.limit("1/h", key="k", wait=1, penalty="2 refusals/m for 1h")

        @limit
        async def work() -> None: ...

        await work()
        with pytest.raises(RateLimitExceeded) as first:
            await work()
        assert first.value.decision.penalty is None
        with pytest.raises(RateLimitExceeded) as second:
            await work()
        assert second.value.decision.penalty == pytest.approx(3600)
        await rl.aclose()

    run_virtual(main)


def served(rl: RateLimit, route: Route) -> httpx.AsyncClient:
    async def endpoint(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[StarletteRoute("/{path:path}", endpoint)])
    app.add_middleware(RateLimitMiddleware, limiter=rl, routes=[route])
    transport = httpx.ASGITransport(app=app, client=("10.1.1.1", 4000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def test_a_delayed_request_that_is_admitted_counts_no_refusal() -> None:
    """ip:2/s, delay=1.5, bursts of four requests two seconds apart: two of each burst
    wait a second and are admitted; six interim refusals within a minute, none counted: a
    client only slowed down is never held back."""

    async def main() -> tuple[list[int], list[object]]:
        rl = RateLimit(MemoryBackend(clock=asyncio.get_running_loop().time), "d")
        route = Route("/api/{p:path}", "ip:2/s", delay=1.5, penalty="3 refusals/m for 1h")
        statuses: list[int] = []
        async with served(rl, route) as http:
            for _ in range(3):
                answers = await asyncio.gather(*(http.get("/api/x") for _ in range(4)))
                statuses += [r.status_code for r in answers]
                await asyncio.sleep(2)
        holds: list[object] = list(await rl.penalties.list())
        await rl.aclose()
        return statuses, holds

    statuses, holds = run_virtual(main)
    assert statuses == [200] * 12
    assert holds == []


def test_a_delayed_request_refused_in_the_end_counts_once() -> None:
    async def main() -> list[tuple[int, str | None]]:
        rl = RateLimit(MemoryBackend(clock=asyncio.get_running_loop().time), "d")
        route = Route("/api/{p:path}", "ip:1/h", delay=1, penalty="2 refusals/m for 1h")
        seen = []
        async with served(rl, route) as http:
            for _ in range(3):
                response = await http.get("/api/x")
                seen.append((response.status_code, response.headers.get("retry-after")))
        await rl.aclose()
        return seen

    seen = run_virtual(main)
    assert [status for status, _ in seen] == [200, 429, 429]
    assert seen[2][1] == "3600"  # the second refusal started the hold
