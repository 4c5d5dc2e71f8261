"""An application for tests/test_header_case.py under a real uvicorn (``--factory``): the
user's own functions read headers by the names HTTP clients write (``X-API-Key``).

- ``GET /middleware``: ``apikey:2/m`` in the middleware, its key read by a function;
- ``GET /dependency``: the same limit as a ``RouteLimit`` the endpoint checks;
- ``GET /settled``: ``apikey:5/m``, each request settled to the cost its response's
  ``X-Cost`` header names, read by a function of request and response.

Storage is ``memory://``: one uvicorn worker, one process.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

from ratelimit import RateLimit
from ratelimit.asgi import HTTPRequest, HTTPResponse, RateLimitMiddleware, Route, RouteLimit


def api_key(request: HTTPRequest) -> str | None:
    """The key, as a newcomer writes it: the header's name as clients send it."""
    return request.headers.get("X-API-Key")


def cost(request: HTTPRequest, response: HTTPResponse) -> int:
    return int(response.headers.get("X-Cost", "1"))


def app() -> Starlette:
    rl = RateLimit.from_url("memory://", denial_cache=0)
    per_key = RouteLimit(rl, "apikey:2/m", key="dependency", apikey=api_key)

    async def plain(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def dependency(request: Request) -> PlainTextResponse:
        await per_key.check(request)
        return PlainTextResponse("ok")

    async def settled(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok", headers={"X-Cost": "5"})

    application = Starlette(
        routes=[
            StarletteRoute("/middleware", plain),
            StarletteRoute("/dependency", dependency),
            StarletteRoute("/settled", settled),
            StarletteRoute("/health", plain),
        ]
    )
    application.add_middleware(
        RateLimitMiddleware,
        limiter=rl,
        routes=[
            Route("/middleware", "apikey:2/m", apikey=api_key),
            Route("/settled", "apikey:5/m", apikey=api_key, settle=cost),
        ],
        exclude=["/health"],
    )
    return application
