"""One OS process of the penalty tests across processes.

``python -m tests.penalty_worker URL NAMESPACE ENGINE CALLS [STORE]``, ENGINE ``script`` or
``commands`` (the Redis at URL), or ``postgres`` (the database at STORE, sliding windows;
URL's Redis still carries the signals): says it is ready, waits for the go signal (a
BLPOP), makes CALLS decisions of one identifier under ``ip:1/h`` with
``penalty="8 refusals/h for 1h"``, says it is done
and waits for a second go (every process done); then asks again with a limiter made anew
(nothing known in this process) and its own. Prints: admitted, refused by the rules,
refusals that started the hold, held; then the hold seen by the new limiter's peek and by
its own limiter's next decision (seconds, 0 for none).
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from ratelimit import RateLimit

RULES, PENALTY = "ip:1/h", "8 refusals/h for 1h"
STORE = sys.argv[5] if len(sys.argv) > 5 else ""


def limiter(url: str, namespace: str, engine: str) -> RateLimit:
    if engine == "postgres":
        return RateLimit.from_url(
            STORE, namespace=namespace, algorithm="sliding-window", timeout=5, on_error="raise"
        )
    return RateLimit.from_url(
        url,
        namespace=namespace,
        use_scripts=engine == "script",
        timeout=5,
        on_error="raise",
    )


async def main(url: str, namespace: str, engine: str, calls: int) -> str:
    control = aioredis.Redis.from_url(url)
    rl = limiter(url, namespace, engine)
    limit = rl.limit(RULES, key="login", ip="203.0.113.9", penalty=PENALTY)
    counts = {"admitted": 0, "refused": 0, "started": 0, "held": 0}
    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    for _ in range(calls):
        decision = await limit.decide()
        if decision.allowed:
            counts["admitted"] += 1
        elif decision.penalty is None:
            counts["refused"] += 1
        elif decision.penalty > 3599:  # this refusal started it (or read it at once)
            counts["started"] += 1
        else:
            counts["held"] += 1
    await control.incr(f"{namespace}:done")
    await control.blpop([f"{namespace}:again"], timeout=30)
    fresh = limiter(url, namespace, engine)
    seen = await fresh.limit(RULES, key="login", ip="203.0.113.9", penalty=PENALTY).peek()
    own = await limit.decide()
    await fresh.aclose()
    await rl.aclose()
    await control.aclose()
    return " ".join(
        [*(str(n) for n in counts.values()), f"{seen.penalty or 0:.0f}", f"{own.penalty or 0:.0f}"]
    )


if __name__ == "__main__":
    url, namespace, engine, calls = sys.argv[1:5]
    print(asyncio.run(main(url, namespace, engine, int(calls))), flush=True)
