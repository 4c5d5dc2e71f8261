"""An application the delay tests serve under real uvicorn processes (``--factory``),
configured by environment variables so that several processes share one store's counters:

- ``RL_TEST_STORAGE``: the storage URL (default ``memory://``);
- ``RL_TEST_NAMESPACE``: the limiter's namespace, one for every process of a test;
- ``RL_TEST_RULES``: the route's rules (default ``ip:5/s``);
- ``RL_TEST_DELAY``: its ``delay=`` in seconds (default 3);
- ``RL_TEST_ALGORITHM``: the limiter's algorithm (default ``sliding-log``).

``/api/...`` is limited and answers with the process's id and the time it ran
(``time.time()``); ``/health`` and ``/waiting`` (how many requests wait in this process)
are not limited.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route as StarletteRoute

from ratelimit import RateLimit
from ratelimit.asgi import RateLimitMiddleware, Route


def app() -> Starlette:
    storage = os.environ.get("RL_TEST_STORAGE", "memory://")
    rl = RateLimit.from_url(
        storage,
        namespace=os.environ.get("RL_TEST_NAMESPACE", "delay"),
        on_error="raise",  # a degraded answer would hide a bug
        algorithm=os.environ.get("RL_TEST_ALGORITHM", "sliding-log"),
        **({"timeout": 5} if storage.startswith("redis") else {}),  # type: ignore[arg-type]
    )

    async def api(request: Request) -> JSONResponse:
        return JSONResponse({"pid": os.getpid(), "at": time.time()})

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    rules = os.environ.get("RL_TEST_RULES", "ip:5/s")
    route = Route("/api/{path:path}", rules, delay=float(os.environ.get("RL_TEST_DELAY", "3")))

    async def waiting(request: Request) -> JSONResponse:
        return JSONResponse(route.room.count if route.room is not None else 0)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with rl:
            yield

    served = Starlette(
        routes=[
            StarletteRoute("/health", health),
            StarletteRoute("/waiting", waiting),
            StarletteRoute("/api/{path:path}", api),
        ],
        lifespan=lifespan,
    )
    served.add_middleware(RateLimitMiddleware, limiter=rl, routes=[route])
    return served
