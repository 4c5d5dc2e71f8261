"""tests/migrating_slowapi_before.py ported: the "after" of the migration guide
(docs/migrating.md shows this module's code from ``from fastapi`` on, and
tests/test_migrating.py checks that both limit alike)."""

# No "from __future__ import annotations": FastAPI reads the endpoints' annotations.
from fastapi import FastAPI

from ratelimit import RateLimit
from ratelimit.asgi import HTTPRequest, RateLimitMiddleware, Route


def api_key_or_ip(request: HTTPRequest) -> str:
    return request.headers.get("X-API-Key") or request.client_ip


rl = RateLimit.from_url("memory://")
app = FastAPI()
app.add_middleware(
    RateLimitMiddleware,
    limiter=rl,
    routes=[  # the first route that matches decides
        Route("/login", "ip:5/minute", methods=["POST"]),
        Route("/api/items", "client:20/minute", client=api_key_or_ip),
        Route("/search", "ip:3/minute | ip:20/hour"),
        Route("/*", "ip:10/minute", per_route=True),  # default_limits: each route its own
    ],
    exclude=["/health"],  # @limiter.exempt
    legacy_headers=True,  # X-RateLimit-Limit, -Remaining, -Reset (in seconds)
)


@app.post("/login")
async def login() -> dict[str, str]:
    return {"token": "t-1"}


@app.get("/api/items")
async def items() -> list[str]:
    return ["tea", "cups"]


@app.get("/search")
async def search(q: str = "") -> list[str]:
    return []


@app.get("/about")
async def about() -> dict[str, str]:
    return {"shop": "teas"}


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
