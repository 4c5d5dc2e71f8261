"""Applications for the HTTP edge tests (tests/test_http_edges.py) under a real uvicorn
(``--factory``), configured by environment variables so that each test's server is its own:

- ``RL_TEST_TRUSTED``: trusted proxies, comma-separated (default none);
- ``RL_TEST_FORWARDED``: the header the trusted proxy sets (default: not passed);
- ``RL_TEST_TYPED``: ``int`` to read the account as an integer (default: not passed).

Storage is ``memory://``: one uvicorn worker, one process, so the edge is what is tested.
"""

# No "from __future__ import annotations": FastAPI reads the endpoints' annotations.
import os
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Mount
from starlette.routing import Route as StarletteRoute

from ratelimit import Decision, RateLimit
from ratelimit.asgi import RateLimitMiddleware, Route, RouteLimit, json_field


def limiter() -> RateLimit:
    return RateLimit.from_url("memory://", denial_cache=0)


def proxy_options() -> dict[str, Any]:
    """``trusted_proxies`` and, when set, ``forwarded_header`` from the environment."""
    options: dict[str, Any] = {
        "trusted_proxies": [t for t in os.environ.get("RL_TEST_TRUSTED", "").split(",") if t]
    }
    if os.environ.get("RL_TEST_FORWARDED"):
        options["forwarded_header"] = os.environ["RL_TEST_FORWARDED"]
    return options


async def plain(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def proxied_app() -> Starlette:
    """``GET /ping``: ``ip:5/m`` by the middleware; ``GET /dependency``: ``ip:5/m`` by a
    ``RouteLimit`` the endpoint checks. Both read the client as ``proxy_options()`` say."""
    rl = limiter()
    inner = RouteLimit(rl, "ip:5/m", key="dependency", **proxy_options())

    async def dependency(request: Request) -> PlainTextResponse:
        await inner.check(request)
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            StarletteRoute("/ping", plain),
            StarletteRoute("/health", plain),
            StarletteRoute("/dependency", dependency),
        ]
    )
    app.add_middleware(
        RateLimitMiddleware,
        limiter=rl,
        routes=[Route("/ping", "ip:5/m", methods=["GET"])],
        exclude=["/health"],
        **proxy_options(),
    )
    return app


def _middleware(rl: RateLimit) -> dict[str, Any]:
    return {
        "limiter": rl,
        "routes": [Route("/ping", "ip:5/m", methods=["GET"]), Route("/*", "ip:3/m")],
        "exclude": ["/health"],
        "trusted_proxies": ["127.0.0.1"],
    }


def starlette_paths() -> Starlette:
    """The application of the path tests, in Starlette: ``/ping`` (``ip:5/m``), every other
    path ``ip:3/m`` except ``/health``; ``/items/{item}`` also checks a ``RouteLimit`` of
    ``2/m`` for all items together and answers with its key."""
    rl = limiter()
    items = RouteLimit(rl, "2/m")

    async def item(request: Request) -> JSONResponse:
        decision = await items.check(request)
        return JSONResponse({"key": decision.key, "path": request.scope["path"]})

    app = Starlette(
        routes=[
            StarletteRoute("/ping", plain),
            StarletteRoute("/health", plain),
            StarletteRoute("/other", plain),
            StarletteRoute("/items/{item}", item),
        ]
    )
    app.add_middleware(RateLimitMiddleware, **_middleware(rl))
    return app


def fastapi_paths() -> FastAPI:
    """:func:`starlette_paths` in FastAPI, the ``RouteLimit`` a dependency."""
    rl = limiter()
    items = RouteLimit(rl, "2/m")
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, **_middleware(rl))

    @app.get("/ping")
    @app.get("/health")
    @app.get("/other")
    async def ok() -> str:
        return "ok"

    @app.get("/items/{item}")
    async def item(
        item: int, request: Request, decision: Annotated[Decision, Depends(items)]
    ) -> dict[str, Any]:
        return {"key": decision.key, "path": request.scope["path"]}

    return app


def mounted_paths() -> Starlette:
    """:func:`starlette_paths` mounted at ``/v1`` and :func:`fastapi_paths` at ``/v2`` of a
    Starlette application (each its own limiter)."""
    return Starlette(
        routes=[
            StarletteRoute("/health", plain),
            Mount("/v1", app=starlette_paths()),
            Mount("/v2", app=fastapi_paths()),
        ]
    )


class Transfer(BaseModel):
    account: int


def accounts_app() -> FastAPI:
    """``POST /transfer`` with ``{"account": <int>}``: ``account:3/h`` from the JSON body
    (as an integer when ``RL_TEST_TYPED=int``)."""
    rl = limiter()
    typed = {"type": int} if os.environ.get("RL_TEST_TYPED") == "int" else {}
    transfers = RouteLimit(rl, "account:3/h", account=json_field("account", **typed))
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limiter=rl, exclude=["/health"])

    @app.get("/health")
    async def health() -> str:
        return "ok"

    @app.post("/transfer")
    async def transfer(
        body: Transfer, decision: Annotated[Decision, Depends(transfers)]
    ) -> dict[str, Any]:
        return {"account": body.account, "left": decision.remaining}

    return app
