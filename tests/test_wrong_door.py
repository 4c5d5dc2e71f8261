"""A limiter used through the wrong door says which door: ``with`` on an async limit (use
``async with``, or ``ratelimit.sync`` in threaded code), the threaded limiter given to the
ASGI middleware or a ``RouteLimit``, the async one given to the WSGI middleware; each names
both modules."""

from __future__ import annotations

from typing import Any

import pytest

import ratelimit.sync
from ratelimit import RateLimit

pytestmark = pytest.mark.timeout(30)


def test_with_on_an_async_limit_says_async_with() -> None:
    rl = RateLimit.from_url("memory://")
    for made in (rl.limit("5/s", key="k"), rl.concurrency("5", key="c")):
        with pytest.raises(TypeError) as refused, made:
            pass  # pragma: no cover: never entered
        assert "is entered with 'async with'" in str(refused.value)
        assert "ratelimit.sync.RateLimit" in str(refused.value)


def test_the_threaded_limiter_given_to_the_asgi_middleware_is_named() -> None:
    pytest.importorskip("starlette")
    from ratelimit.asgi import RateLimitMiddleware, Route, RouteLimit

    async def app(scope: Any, receive: Any, send: Any) -> None: ...

    with ratelimit.sync.RateLimit.from_url("memory://") as threaded:
        with pytest.raises(TypeError) as refused:
            RateLimitMiddleware(app, threaded, [Route("/a", "5/m")])  # type: ignore[arg-type]
        message = str(refused.value)
        assert "must be a ratelimit.RateLimit (async" in message
        assert "not a ratelimit.sync.RateLimit, which is for threaded code" in message
        with pytest.raises(TypeError, match="not a ratelimit.sync.RateLimit"):
            RouteLimit(threaded, "5/m")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="not builtins.str"):
            RateLimitMiddleware(app, "memory://", [Route("/a", "5/m")])  # type: ignore[arg-type]


def test_the_async_limiter_given_to_the_wsgi_middleware_is_named() -> None:
    from ratelimit.asgi import Route
    from ratelimit.wsgi import RateLimitMiddleware

    def app(environ: Any, start_response: Any) -> list[bytes]:
        return []

    with pytest.raises(TypeError) as refused:
        RateLimitMiddleware(app, RateLimit.from_url("memory://"), [Route("/a", "5/m")])  # type: ignore[arg-type]
    message = str(refused.value)
    assert "must be a ratelimit.sync.RateLimit (threaded code)" in message
    assert "not ratelimit.RateLimit, the async one" in message
