"""The FastAPI application ``bench/web.py`` serves, once per contender: ``GET /ping`` limited
to 1000 a minute per ``X-API-Key`` (the load spreads over 1000 keys, so nothing is refused),
counters in the Redis at ``BENCH_REDIS``. ``BENCH_APP`` picks the limiter:

- ``none``: no limiter (the ceiling);
- ``none-dependency``: no limiter, a FastAPI dependency that does nothing;
- ``redis-dependency``: no limiter, a dependency that awaits one Redis ``INCR``;
- ``ratelimit``: ours, ``RateLimitMiddleware`` (sliding log, the default; RateLimit headers);
- ``ratelimit-dependency``: ours, a ``RouteLimit`` dependency (with the middleware for headers);
- ``ratelimit-fixed``: ours on a fixed window, as slowapi counts by default;
- ``slowapi``: slowapi's decorator (fixed window on ``limits``' Redis storage; its headers on);
- ``fastapi-limiter``: fastapi-limiter's dependency (pyrate-limiter's Redis bucket per key).
"""

# No "from __future__ import annotations": FastAPI reads the endpoints' annotations.
import gc
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request, Response

from ratelimit import RateLimit
from ratelimit.asgi import RateLimitMiddleware, Route, RouteLimit, header

REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0")
RULE = "apikey:1000/m"
PREFIX = f"bench-http-{uuid.uuid4().hex[:8]}"


def plain() -> FastAPI:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> str:
        return "pong"

    return app


def noop_dependency() -> FastAPI:
    """No limiter, and a dependency that does nothing: what FastAPI's dependency
    injection costs any dependency, ours included."""
    app = FastAPI()

    async def nothing(request: Request) -> None:
        return None

    @app.get("/ping", dependencies=[Depends(nothing)])
    async def ping() -> str:
        return "pong"

    return app


def redis_dependency() -> FastAPI:
    """No limiter, and a dependency that awaits one Redis round trip (``INCR`` of the
    request's key, as the simplest fixed window would): what any dependency that waits on
    I/O costs, the garbage collector's share included."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(lifespan=lifespan)

    async def count(request: Request) -> None:
        await client.incr(f"{PREFIX}:{request.headers['x-api-key']}")

    @app.get("/ping", dependencies=[Depends(count)])
    async def ping() -> str:
        return "pong"

    return app


def ours(algorithm: str = "sliding-log", dependency: bool = False) -> FastAPI:
    rl = RateLimit.from_url(REDIS, namespace=PREFIX, algorithm=algorithm)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await rl.aclose()

    app = FastAPI(lifespan=lifespan)
    routes = [] if dependency else [Route("/ping", RULE, apikey=header("x-api-key"))]
    app.add_middleware(RateLimitMiddleware, limiter=rl, routes=routes)
    limit = RouteLimit(rl, RULE, apikey=header("x-api-key"))

    @app.get("/ping", dependencies=[Depends(limit)] if dependency else [])
    async def ping() -> str:
        return "pong"

    return app


def slowapi() -> FastAPI:
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded

    limiter = Limiter(
        key_func=lambda request: request.headers["x-api-key"],
        storage_uri=REDIS,
        key_prefix=PREFIX,
        headers_enabled=True,
    )
    app = FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]

    @app.get("/ping")
    @limiter.limit("1000/minute")
    async def ping(request: Request, response: Response) -> str:
        return "pong"

    return app


def fastapi_limiter() -> FastAPI:
    import redis.asyncio as aioredis
    from fastapi_limiter.depends import RateLimiter
    from pyrate_limiter import BucketFactory, Duration, Limiter, Rate, RateItem, RedisBucket

    client = aioredis.Redis.from_url(REDIS)
    rates = [Rate(1000, Duration.MINUTE)]
    buckets: dict[str, Any] = {}

    class PerKey(BucketFactory):
        """One Redis bucket per API key, as pyrate-limiter documents per-key limits."""

        def wrap_item(self, name: str, weight: int = 1) -> RateItem:
            return RateItem(name, time.time_ns() // 1_000_000, weight=weight)

        def get(self, item: RateItem) -> Any:
            return buckets[item.name.split(":", 1)[0]]

    async def identifier(request: Request) -> str:
        key = request.headers["x-api-key"]
        if key not in buckets:
            buckets[key] = await RedisBucket.init(rates, client, f"{PREFIX}:{key}")
        return key

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(lifespan=lifespan)
    limiter = RateLimiter(limiter=Limiter(PerKey()), identifier=identifier)

    @app.get("/ping", dependencies=[Depends(limiter)])
    async def ping() -> str:
        return "pong"

    return app


def app() -> FastAPI:
    """The application ``BENCH_APP`` names (uvicorn ``--factory``); with ``BENCH_GC_FREEZE``
    set, everything built so far is moved out of the garbage collector's sight
    (``gc.freeze()``), as a long-running service may do once it has started."""
    which = os.environ.get("BENCH_APP", "none")
    factories = {
        "none": plain,
        "none-dependency": noop_dependency,
        "redis-dependency": redis_dependency,
        "ratelimit": ours,
        "ratelimit-dependency": lambda: ours(dependency=True),
        "ratelimit-fixed": lambda: ours("fixed-window"),
        "slowapi": slowapi,
        "fastapi-limiter": fastapi_limiter,
    }
    built = factories[which]()
    if os.environ.get("BENCH_GC_FREEZE"):
        gc.collect()
        gc.freeze()
    return built
