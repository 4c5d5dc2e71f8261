"""A FastAPI service limited per client IP, per username from the JSON body and per API key.

Run it (Redis when REDIS_URL is set, else the in-process memory:// store)::

    uvicorn examples.web_app:app --no-proxy-headers

Then ``curl -i localhost:8000/ping`` six times: the sixth answers 429 with ``Retry-After``,
and every answer carries ``RateLimit-Policy`` and ``RateLimit`` headers.

- ``GET /ping``: 5 a minute per client IP.
- ``POST /login`` with ``{"username": "..."}``: 3 a minute per username.
- ``GET /search`` with an ``X-API-Key`` header: 10 a minute per key.
- ``GET /health``: never limited.

No proxy is trusted: the client is the connection's peer, whatever ``X-Forwarded-For`` says.
Behind a proxy, pass ``trusted_proxies=["10.0.0.0/8"]`` (its addresses) to the middleware.
"""

from __future__ import annotations

import os
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
