"""The application of the lock-over-HTTP tests, served by a real uvicorn (``--factory``):
``RateLimitMiddleware`` over the command engine (``use_scripts=False``), configured by
environment variables so that each test's server is its own:

- ``RL_LOCK_STORAGE``: the Redis URL;
- ``RL_LOCK_NAMESPACE``: the limiter's namespace;
- ``RL_LOCK_ON_ERROR``: the failure policy (default ``allow``).

``GET /ping`` is limited to ``5/m`` (key ``"ping"``, lock ``rl:{<namespace>:ping}:lock``),
with ``lock_timeout`` 0.2 s; ``GET /health`` is not limited.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ratelimit import RateLimit
from ratelimit.asgi import RateLimitMiddleware, Route

Message = MutableMapping[str, Any]


async def endpoint(
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"pong"})


def create() -> RateLimitMiddleware:
    rl = RateLimit.from_url(
        os.environ["RL_LOCK_STORAGE"],
        namespace=os.environ["RL_LOCK_NAMESPACE"],
        on_error=os.environ.get("RL_LOCK_ON_ERROR", "allow"),
        use_scripts=False,
        lock_timeout=0.2,
        denial_cache=0,
    )
    return RateLimitMiddleware(
        endpoint, rl, [Route("/ping", "5/m", key="ping", methods=["GET"])], exclude=["/health"]
    )
