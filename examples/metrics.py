"""Hooks: count every decision by outcome and rule, as a metrics exporter would.

python examples/metrics.py           # memory://, or Redis with REDIS_URL set
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter

from ratelimit import Decision, RateLimit, RateLimitExceeded

outcomes: Counter[str] = Counter()


def count(decision: Decision) -> None:
    """A hook: called with every decision. Keep it cheap: count here, export elsewhere."""
    outcome = "degraded" if decision.degraded else "allowed" if decision.allowed else "denied"
    outcomes[f"{decision.key} {outcome} by {decision.rule}"] += 1


async def main() -> None:
    url = os.environ.get("REDIS_URL", "memory://")
    async with RateLimit.from_url(url, "metrics-example", hooks=[count]) as rl:

        @rl.limit("ip:5/m", key="api")
        async def handle(ip: str) -> str:
            return "200 OK"

        for ip in ["198.51.100.7"] * 8 + ["203.0.113.9"] * 2:
            with contextlib.suppress(RateLimitExceeded):  # an HTTP front end would answer 429
                await handle(ip)

    for line, n in sorted(outcomes.items()):
        print(f"{n:3}  {line}")


if __name__ == "__main__":
    asyncio.run(main())
