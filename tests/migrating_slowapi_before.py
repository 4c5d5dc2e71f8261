"""A FastAPI shop limited by slowapi, as its users write it: the "before" of the migration
guide (docs/migrating.md shows this module's code from ``from fastapi`` on, and
tests/test_migrating.py checks that it still does). Ported in
tests/migrating_slowapi_after.py."""

# No "from __future__ import annotations": FastAPI reads the endpoints' annotations.
# mypy: disable-error-code="arg-type, untyped-decorator"
from fastapi import FastAPI, Request, Response
from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.middleware import SlowAPIMiddleware
from slowapi.util import get_remote_address


def api_key_or_ip(request: Request) -> str:
    return request.headers.get("X-API-Key") or get_remote_address(request)


limiter = Limiter(key_func=get_remote_address, default_limits=["10/minute"], headers_enabled=True)
app = FastAPI()
app.state.limiter = limiter
app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)
app.add_middleware(SlowAPIMiddleware)  # applies default_limits to every route


@app.post("/login")
@limiter.limit("5/minute")
async def login(request: Request, response: Response) -> dict[str, str]:
    return {"token": "t-1"}


@app.get("/api/items")
@limiter.limit("20/minute", key_func=api_key_or_ip)
async def items(request: Request, response: Response) -> list[str]:
    return ["tea", "cups"]


@app.get("/search")
@limiter.limit("3/minute;20/hour")
async def search(request: Request, response: Response, q: str = "") -> list[str]:
    return []


@app.get("/about")
async def about() -> dict[str, str]:
    return {"shop": "teas"}


@app.get("/health")
@limiter.exempt
async def health() -> dict[str, str]:
    return {"status": "ok"}
