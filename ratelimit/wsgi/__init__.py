"""Rate limits for WSGI applications (Flask, Django, Bottle, Pyramid, plain PEP 3333): the
ASGI middleware's routes, sources, trusted proxies, headers and refusals, on the
synchronous limiter (:mod:`ratelimit.sync`).

Example::

    from ratelimit.sync import RateLimit
    from ratelimit.wsgi import RateLimitMiddleware, Route, header

    rl = RateLimit.from_url("redis://localhost:6379")
    application = RateLimitMiddleware(
        application,
        rl,
        routes=[Route("/login", "ip:5/m", methods=["POST"]),
                Route("/search", "apikey:10/m", apikey=header("x-api-key"))],
        exclude=["/health"],
    )

``Route``, the sources and ``TrustedProxies`` are :mod:`ratelimit.asgi`'s, re-exported here.
"""

from __future__ import annotations

from ratelimit.asgi.limits import HTTPResponse
from ratelimit.asgi.proxies import TrustedProxies
from ratelimit.asgi.request import HTTPRequest
from ratelimit.asgi.routes import Route
from ratelimit.asgi.sources import Source, client_ip, header, path_param, query_param, user
from ratelimit.wsgi.environ import scope_of
from ratelimit.wsgi.middleware import RateLimitMiddleware

__all__ = [
    "HTTPRequest",
    "HTTPResponse",
    "RateLimitMiddleware",
    "Route",
    "Source",
    "TrustedProxies",
    "client_ip",
    "header",
    "path_param",
    "query_param",
    "scope_of",
    "user",
]
