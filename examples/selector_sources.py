"""Selectors: where ``username``, ``apikey`` or ``ip`` come from, and keys shared by functions.

python examples/selector_sources.py         # memory://, or Redis with REDIS_URL set
"""

from __future__ import annotations

import asyncio
import contextvars
import os
from typing import Any

from ratelimit import And, RateLimit, RateLimitExceeded

current_user: contextvars.ContextVar[str] = contextvars.ContextVar("current_user")


class API:
    """A selector object: attributes, methods and async methods all work."""

    apikey = "key-1"

    def username(self) -> str:
        return current_user.get()

    async def ip(self) -> str:
        return "203.0.113.7"


async def attempt(label: str, call: Any) -> None:
    try:
        await call
        print(f"{label}: ok")
    except RateLimitExceeded as exc:
        print(f"{label}: refused by {exc.rule} (key {exc.key!r}), retry in {exc.retry_after:.1f} s")


async def main() -> None:
    async with RateLimit.from_url(os.environ.get("REDIS_URL", "memory://"), "selectors") as rl:
        # 1. keyword arguments: a literal, a callable, an async callable
        @rl.limit("username:2/m", username=current_user.get)
        async def profile() -> None: ...

        current_user.set("vova")
        for n in range(3):
            await attempt(f"profile by vova #{n + 1}", profile())
        current_user.set("dima")
        await attempt("profile by dima", profile())

        # 2. a selector object, and a key shared with another function
        @rl.limit(And("username:3/m", "apikey:3/m"), selector=API(), key="cats")
        async def good_kittie() -> None: ...

        @rl.limit(key="cats")  # the rules *and* the selector object of "cats"
        async def bad_kittie() -> None: ...

        for n in range(2):
            await attempt(f"good_kittie #{n + 1}", good_kittie())
        for n in range(2):
            await attempt(f"bad_kittie #{n + 1}", bad_kittie())

        # 3. the call's own arguments, by parameter name
        @rl.limit("user:1/m")
        async def login(user: str, password: str) -> None: ...

        await attempt("login alice", login("alice", "pw"))
        await attempt("login alice again", login("alice", "pw"))
        await attempt("login bob", login("bob", "pw"))

        # 4. attributes of self, for methods
        class Client:
            def __init__(self, tenant: str) -> None:
                self.tenant = tenant

            @rl.limit("tenant:1/m")
            async def sync(self) -> None: ...

        await attempt("tenant acme", Client("acme").sync())
        await attempt("tenant acme again", Client("acme").sync())

        # A selector that resolves to None or "" is not limited: anonymous calls pass.
        @rl.limit("username:1/m", username=lambda: None)
        async def anonymous() -> None: ...

        await attempt("anonymous", anonymous())
        await attempt("anonymous again", anonymous())


if __name__ == "__main__":
    asyncio.run(main())
