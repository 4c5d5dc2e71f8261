"""Delay instead of refuse: a spike on a route with ``delay=`` waits its turn.

Twelve requests at once from one client on a route limited to ``ip:4/s`` with
``delay=1.5``: four are admitted at once, the next four wait about a second (until the
rule frees) and are admitted, and the last four are answered 429 once it is clear they
cannot be admitted within their 1.5 s. Without ``delay=`` all eight would be 429 at once.

Runs the middleware in process (httpx's ASGI transport), on Redis when REDIS_URL is set,
else on the in-process memory:// store; takes about a second and a half.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

from ratelimit import RateLimit
from ratelimit.asgi import RateLimitMiddleware, Route


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


async def main() -> None:
    storage = os.environ.get("REDIS_URL", "memory://")
    async with RateLimit.from_url(storage, namespace=f"delay-{uuid.uuid4().hex[:8]}") as rl:
        app = Starlette(routes=[StarletteRoute("/api/{path:path}", hello)])
        app.add_middleware(
            RateLimitMiddleware,
            limiter=rl,
            routes=[Route("/api/{path:path}", "ip:4/s", delay=1.5, waiting=50)],
        )
        transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as http:

            async def timed(n: int) -> tuple[int, float]:
                started = time.monotonic()
                response = await http.get(f"/api/items/{n}")
                return response.status_code, time.monotonic() - started

            answers = await asyncio.gather(*(timed(n) for n in range(12)))
    at_once = sum(1 for status, took in answers if status == 200 and took < 0.5)
    waited = [took for status, took in answers if status == 200 and took >= 0.5]
    refused = [took for status, took in answers if status == 429]
    print(f"12 at once on ip:4/s, delay=1.5: {at_once} admitted at once")
    if waited:
        print(f"{len(waited)} admitted after waiting (the longest {max(waited):.2f} s)")
    print(f"{len(refused)} refused with 429")


if __name__ == "__main__":
    asyncio.run(main())
