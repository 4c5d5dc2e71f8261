"""Count only what failed: a login limit that locks a username out after three wrong
passwords in 15 minutes, however often it logs in right (``count_when``).

    python examples/failed_logins.py                                   # in-process memory://
    REDIS_URL=redis://localhost:6379/0 python examples/failed_logins.py  # shared via Redis

Every attempt is decided first, its hit reserved while the check runs, so concurrent
guesses never slip past the limit together; a login that succeeds is refunded as it ends.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from ratelimit import RateLimit, RateLimitExceeded

PASSWORDS = {"ann": "tea", "bob": "cups"}


async def main() -> None:
    url = os.environ.get("REDIS_URL", "memory://")
    namespace = f"failed-logins-{uuid.uuid4().hex[:8]}"  # a fresh run each time
    async with RateLimit.from_url(url, namespace=namespace) as rl:

        @rl.limit("username:3/15m", count_when=lambda ok: not ok)
        async def login(username: str, password: str) -> bool:
            return PASSWORDS.get(username) == password

        for n in range(1, 6):
            print(f"ann right #{n}: {await login('ann', 'tea')}")  # never counted
        for n in range(1, 5):
            try:
                print(f"ann wrong #{n}: {await login('ann', 'guess')}")
            except RateLimitExceeded as exc:
                print(f"ann wrong #{n}: locked out by {exc.rule}, {exc.retry_after:.0f} s left")
        try:
            await login("ann", "tea")
        except RateLimitExceeded:
            print("ann right again: locked out too, until the failures age out")
        print(f"bob right: {await login('bob', 'cups')}")  # another username: its own count


if __name__ == "__main__":
    asyncio.run(main())
