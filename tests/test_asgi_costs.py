"""The HTTP edge's costs, settles and unit reporting in process (httpx's ASGI transport;
tests/test_http_settle.py runs the same under uvicorn): configuration checked when made, a
settle that goes wrong never breaks the response, and a concurrency limit inside the
application reports ``qu="concurrent-requests"`` on its 429."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from ratelimit import ConfigurationError, MemoryBackend, RateLimit
from ratelimit.asgi import HTTPRequest, RateLimitMiddleware, Route, RouteLimit, header
from tests.test_asgi import app_with, client

pytestmark = pytest.mark.timeout(30)
RULES = "api:100/m | api:1000 tokens/m"


def test_a_bad_cost_or_settle_fails_when_the_app_starts() -> None:
    rl = RateLimit(MemoryBackend())

    async def app(scope: Any, receive: Any, send: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="names unit 'rows', which no rule"):
        RateLimitMiddleware(app, rl, [Route("/a", RULES, cost={"rows": 1}, api=header("k"))])
    with pytest.raises(ConfigurationError, match="no amount for unit 'tokens'"):
        RouteLimit(rl, RULES, cost={}, api=header("k"))
    with pytest.raises(TypeError, match="settle must be a response header's name"):
        Route("/b", RULES, settle=5, api=header("x-api-key"))  # type: ignore[arg-type]


async def test_a_cost_from_the_request_is_checked_per_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rl = RateLimit(MemoryBackend())

    def cost(request: HTTPRequest) -> dict[str, int]:
        return {"tokens": int(request.query["n"])}

    app = app_with(rl, [Route("/a", RULES, cost=cost, settle="x-used", api=header("x-api-key"))])
    async with client(app) as http:
        assert (await http.get("/a?n=1000", headers={"x-api-key": "k"})).status_code == 200
        assert (await http.get("/a?n=1", headers={"x-api-key": "k"})).status_code == 429
        # a cost its rules never admit is the client's: refused, never a server error
        never = await http.get("/a?n=1001", headers={"x-api-key": "j"})
        assert never.status_code == 429
        assert "retry-after" not in never.headers  # no wait would admit it
        detail = never.json()["detail"]
        assert "its cost (1001) is more than rule 'api:1000 tokens/m' admits at once" in detail
        assert never.json()["violated-policies"] == ["api:1000 tokens/m"]
        # nothing was counted on j: the whole budget is still there
        assert (await http.get("/a?n=1000", headers={"x-api-key": "j"})).status_code == 200


async def test_a_cost_above_what_the_sliding_log_counts_at_once_is_refused() -> None:
    rl = RateLimit(MemoryBackend())  # the sliding log: at most 1000 hits per call
    route = Route(
        "/v1/chat",
        "apikey:60/m | apikey:90000 tokens/m",
        apikey=header("x-api-key"),
        cost=lambda request: {"tokens": int(request.query.get("max_tokens", "1000"))},
    )
    async with client(app_with(rl, [route])) as http:
        refused = await http.get("/v1/chat?max_tokens=2000", headers={"x-api-key": "k"})
        assert refused.status_code == 429
        assert "retry-after" not in refused.headers
        assert "more than this limiter counts in one call" in refused.json()["detail"]
        ok = await http.get("/v1/chat?max_tokens=900", headers={"x-api-key": "k"})
        assert ok.status_code == 200


async def test_a_settle_header_that_is_not_a_number_is_logged_and_the_response_stands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rl = RateLimit(MemoryBackend())

    async def endpoint(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok", headers={"x-used": "lots"})

    route = Route("/a", RULES, cost={"tokens": 10}, settle="x-used", api=header("x-api-key"))
    app = app_with(rl, [route], endpoint)
    with caplog.at_level(logging.WARNING, logger="ratelimit.asgi"):
        async with client(app) as http:
            response = await http.get("/a", headers={"x-api-key": "k"})
    assert response.status_code == 200
    assert response.text == "ok"
    assert any("not settled" in r.getMessage() for r in caplog.records)


async def test_a_full_concurrency_limit_in_the_app_reports_concurrent_requests() -> None:
    rl = RateLimit(MemoryBackend())
    slots = rl.concurrency("api:1", key="one")

    @slots
    async def work(api: str) -> str:
        return "done"

    async def endpoint(request: Request) -> PlainTextResponse:
        return PlainTextResponse(await work(request.headers["x-api-key"]))

    app = app_with(rl, [], endpoint)
    held: Any = rl.concurrency("api:1", key="one", api="k")
    async with held, client(app) as http:
        response = await http.get("/a", headers={"x-api-key": "k"})
    assert response.status_code == 429
    assert response.headers["ratelimit-policy"] == '"api:1";q=1;qu="concurrent-requests"'
    assert response.headers["ratelimit"] == '"api:1";r=0'
    async with client(app) as http:
        assert (await http.get("/a", headers={"x-api-key": "k"})).text == "done"


async def test_an_override_shows_in_the_policy_header_and_falls_back_when_unusable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rl = RateLimit(MemoryBackend())
    app = app_with(rl, [Route("/a", "api:5/m", key="search", api=header("x-api-key"))])
    async with client(app) as http:
        first = await http.get("/a", headers={"x-api-key": "k"})
        assert first.headers["ratelimit-policy"] == '"api:5/m";q=5;w=60'
        await rl.overrides.set("search", "api:50/m", api="k")
        raised = await http.get("/a", headers={"x-api-key": "k"})
        assert raised.headers["ratelimit-policy"] == '"api:50/m";q=50;w=60'
        assert raised.headers["ratelimit"] == '"api:50/m";r=48;t=60'  # counted on: 2 of 50
        other = await http.get("/a", headers={"x-api-key": "j"})
        assert other.headers["ratelimit-policy"] == '"api:5/m";q=5;w=60'
        await rl.overrides.set("search", "ip:1/m", api="j")  # ip: the client's address
        assert (await http.get("/a", headers={"x-api-key": "j"})).status_code == 200
        assert (await http.get("/a", headers={"x-api-key": "j"})).status_code == 429
        await rl.overrides.set("search", "region:1/m", api="k")  # no source for region
        with caplog.at_level(logging.WARNING, logger="ratelimit.asgi"):
            kept = await http.get("/a", headers={"x-api-key": "k"})
        assert kept.headers["ratelimit-policy"] == '"api:5/m";q=5;w=60'
        assert any("region" in r.getMessage() for r in caplog.records)
