"""Limits per tenant: plans chosen per call, and an override set at run time (one customer
raised for a launch) that every process sharing the store applies, then removes itself.

    python examples/tiers.py                                   # memory://
    REDIS_URL=redis://localhost:6379/0 python examples/tiers.py   # shared by processes

The same override from a shell:

    ratelimit override set --storage "$REDIS_URL" --namespace tiers-example \\
        --key search apikey=acme "apikey:8/m" --ttl 86400
"""

from __future__ import annotations

import asyncio
import os
import uuid

from ratelimit import RateLimit, RateLimitExceeded

PLANS = {"free": "apikey:2/m", "pro": "apikey:5/m", "unknown": "apikey:1/m"}
CUSTOMERS = {"acme": "pro", "hobby": "free"}


def plan_of(apikey: str) -> str:
    """Where a real service looks the plan up (a database, a token's claims)."""
    return CUSTOMERS.get(apikey, "unknown")


async def main() -> None:
    url = os.environ.get("REDIS_URL", "memory://")
    namespace = f"tiers-example-{uuid.uuid4().hex[:6]}"  # a fresh start on every run
    async with RateLimit.from_url(url, namespace) as rl:
        # rules chosen per call, from the call's own arguments
        @rl.limit(lambda apikey, q: PLANS[plan_of(apikey)], key="search")
        async def search(apikey: str, q: str) -> str:
            return f"results for {q!r}"

        async def burst(apikey: str, calls: int) -> str:
            admitted = 0
            for n in range(calls):
                try:
                    await search(apikey, f"query {n}")
                    admitted += 1
                except RateLimitExceeded as refused:
                    override = " (override)" if refused.decision.override else ""
                    return f"{admitted} of {calls} admitted; refused by {refused.rule}{override}"
            return f"{calls} of {calls} admitted"

        print(f"hobby (free): {await burst('hobby', 4)}")
        print(f"acme (pro): {await burst('acme', 4)}")
        # launch day: acme gets 8 a minute for a day; its 4 calls so far still count
        await rl.overrides.set("search", "apikey:8/m", apikey="acme", ttl=86_400)
        for override in await rl.overrides.list("search"):
            print(f"override in force: {override}")
        print(f"acme, raised: {await burst('acme', 6)}")
        await rl.overrides.delete("search", apikey="acme")
        print(f"acme, back to pro: {await burst('acme', 1)}")


if __name__ == "__main__":
    asyncio.run(main())
