"""An application metering tokens, served under a real uvicorn (``--factory``) by
``tests/test_http_settle.py``: each request reserves its ``max_tokens`` and settles the
tokens its response reports, per API key. ``RL_TEST_STORAGE``: the storage URL.
"""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

from ratelimit import RateLimit
from ratelimit.asgi import HTTPRequest, HTTPResponse, RateLimitMiddleware, Route, header

RULES = "api:100/m | api:1000 tokens/m"


def max_tokens(request: HTTPRequest) -> dict[str, int]:
    return {"tokens": int(request.query.get("max_tokens", "100"))}


async def reported(request: HTTPRequest, response: HTTPResponse) -> dict[str, int] | None:
    if response.status != 200:
        return None  # failed: the reservation stands
    return {"tokens": int(response.headers["x-usage"])}


async def complete(request: Request) -> PlainTextResponse:
    used = request.query_params.get("used", "0")
    status = int(request.query_params.get("status", "200"))
    return PlainTextResponse("ok", status, headers={"x-tokens-used": used, "x-usage": used})


async def health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def app() -> Starlette:
    rl = RateLimit.from_url(
        os.environ.get("RL_TEST_STORAGE", "memory://"),
        namespace=f"tokens-{os.getpid()}",
        algorithm="sliding-window",
        denial_cache=0,
    )
    api = header("x-api-key")
    routes = [
        Route("/complete", RULES, cost=max_tokens, settle="x-tokens-used", api=api),
        Route("/embed", RULES, cost=max_tokens, settle=reported, api=api),
    ]
    return Starlette(
        routes=[
            StarletteRoute("/complete", complete),
            StarletteRoute("/embed", complete),
            StarletteRoute("/health", health),
        ],
        middleware=[Middleware(RateLimitMiddleware, limiter=rl, routes=routes)],
    )
