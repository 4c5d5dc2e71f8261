"""A FastAPI service limited per client IP, per username from the JSON body and per API key.

Serve it (Redis when REDIS_URL is set, else the in-process memory:// store)::

    uvicorn examples.web_app:app --no-proxy-headers

Then ``curl -i localhost:8000/ping`` six times: the sixth answers 429 with ``Retry-After``,
and every answer carries ``RateLimit-Policy`` and ``RateLimit`` headers. Or run
``python examples/web_app.py``, which sends those requests to the app in process (httpx)
and prints the answers.

- ``GET /ping``: 5 a minute per client IP.
- ``POST /login`` with ``{"username": "..."}``: 3 a minute per username.
- ``GET /search`` with an ``X-API-Key`` header: 10 a minute per key.
- Every other route (``/login`` included): 100 a minute per client IP, each route on
  counters of its own (``per_route=True``).
- ``GET /health``: never limited.

No proxy is trusted: the client is the connection's peer, whatever ``X-Forwarded-For`` says.
Behind a proxy, pass ``trusted_proxies=["10.0.0.0/8"]`` (its addresses; ``["unix"]`` for a
proxy in front of ``uvicorn --uds``) to the middleware, and ``forwarded_header=`` when the
proxy sets ``Forwarded`` or ``X-Real-IP`` rather than ``X-Forwarded-For``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI
from pydantic import BaseModel

from ratelimit import Decision, RateLimit
from ratelimit.asgi import RateLimitMiddleware, Route, RouteLimit, header, json_field

rl = RateLimit.from_url(os.environ.get("REDIS_URL", "memory://"), namespace="web-example")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    await rl.aclose()


app = FastAPI(lifespan=lifespan)
app.add_middleware(
    RateLimitMiddleware,
    limiter=rl,
    routes=[
        Route("/ping", "ip:5/m", methods=["GET"]),
        Route("/search", "apikey:10/m", methods=["GET"], apikey=header("X-API-Key")),
        Route("/*", "ip:100/m", per_route=True),  # every other route: its own 100 per ip
    ],
    exclude=["/health"],
)
login_limit = RouteLimit(rl, "username:3/m", username=json_field("username"))


class Login(BaseModel):
    username: str


@app.get("/ping")
async def ping() -> dict[str, str]:
    return {"ping": "pong"}


@app.post("/login")
async def login(
    body: Login, decision: Annotated[Decision, Depends(login_limit)]
) -> dict[str, object]:
    return {"welcome": body.username, "attempts_left": decision.remaining}


@app.get("/search")
async def search(q: str = "") -> dict[str, object]:
    return {"q": q, "results": []}


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


async def main() -> None:
    """Send the app the requests a curious client would, in process, and print the answers."""
    import httpx

    # A client address and names of this run's own, so that runs within a minute of each
    # other on one Redis don't meet each other's counts.
    run = uuid.uuid4().int
    address = f"10.{run % 250}.{run // 250 % 250}.{run // 62500 % 250}"
    ann, key = f"ann-{run % 10**6}", f"k-{run % 10**6}"
    transport = httpx.ASGITransport(app=app, client=(address, 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://web-example") as http:
        for n in range(1, 7):
            answer = await http.get("/ping")
            print(f"GET /ping #{n}: {answer.status_code}  RateLimit: {answer.headers['ratelimit']}")
        print(f"  Retry-After: {answer.headers['retry-after']}  body: {answer.text}")
        for n in range(1, 5):
            answer = await http.post("/login", json={"username": ann})
            print(f"POST /login ann #{n}: {answer.status_code}")
        answer = await http.get("/search", headers={"X-API-Key": key})
        print(f"GET /search: {answer.status_code}  RateLimit: {answer.headers['ratelimit']}")
        answer = await http.get("/health")
        print(f"GET /health: {answer.status_code}, headers: {sorted(answer.headers)}")
    await rl.aclose()


if __name__ == "__main__":
    import asyncio

    asyncio.run(main())
