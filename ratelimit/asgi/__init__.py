"""Rate limits at the HTTP edge: ASGI middleware and per-route limits, with the IETF
``RateLimit`` headers and RFC 9457 problem details (``pip install "ratelimit-rules[asgi]"``).

Example (FastAPI)::

    from fastapi import Depends, FastAPI
    from ratelimit import RateLimit
    from ratelimit.asgi import RateLimitMiddleware, Route, RouteLimit, header, json_field

    rl = RateLimit.from_url("redis://localhost:6379")
    app = FastAPI()
    app.add_middleware(
        RateLimitMiddleware,
        limiter=rl,
        routes=[Route("/search", "apikey:10/m", apikey=header("x-api-key")),
                Route("/*", "ip:100/m")],
        exclude=["/health"],
    )

    @app.post("/login", dependencies=[Depends(RouteLimit(rl, "username:3/m",
                                                         username=json_field("username")))])
    async def login(...): ...

The middleware imports no framework; :class:`RouteLimit` uses Starlette's request (FastAPI's
too) and is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ratelimit.asgi.headers import limit_field, policy_field, rate_limit_headers
from ratelimit.asgi.limits import HTTPResponse
from ratelimit.asgi.middleware import RateLimitMiddleware
from ratelimit.asgi.proxies import TrustedProxies
from ratelimit.asgi.request import HTTPRequest
from ratelimit.asgi.routes import Route
from ratelimit.asgi.slot_routes import SlotRoute
from ratelimit.asgi.sources import (
    Source,
    client_ip,
    header,
    json_field,
    path_param,
    query_param,
    user,
)
from ratelimit.errors import SourceValueError

if TYPE_CHECKING:
    from ratelimit.asgi.starlette import RouteLimit


def __getattr__(name: str) -> Any:
    if name == "RouteLimit":  # needs Starlette: imported only when used
        from ratelimit.asgi.starlette import RouteLimit

        return RouteLimit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "HTTPRequest",
    "HTTPResponse",
    "RateLimitMiddleware",
    "Route",
    "RouteLimit",
    "SlotRoute",
    "Source",
    "SourceValueError",
    "TrustedProxies",
    "client_ip",
    "header",
    "json_field",
    "limit_field",
    "path_param",
    "policy_field",
    "query_param",
    "rate_limit_headers",
    "user",
]
