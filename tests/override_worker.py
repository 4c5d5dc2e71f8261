"""One OS process of the override test: decides calls of key ``search`` for apikey
``abc`` until it has seen its rules change twice (an override set, then deleted), printing
the rules in force at the start and at each change.

Run as ``python -m tests.override_worker URL NAMESPACE ENGINE`` (ENGINE ``script``,
``locked`` or ``postgres``). Exits 1 after 60 s without both changes.
"""

from __future__ import annotations

import asyncio
import sys
import time

from ratelimit import RateLimit


async def main(url: str, namespace: str, engine: str) -> int:
    if engine == "postgres":
        rl = RateLimit.from_url(url, namespace, algorithm="sliding-window", timeout=None)
    else:
        rl = RateLimit.from_url(url, namespace, use_scripts=engine == "script", timeout=None)
    async with rl:
        limit = rl.limit("apikey:1000/h", key="search", apikey="abc")
        seen: list[str] = []
        deadline = time.monotonic() + 60
        while len(seen) < 3 and time.monotonic() < deadline:
            decision = await limit.peek()
            now = f"{'override' if decision.override else 'own'} {decision.rule}"
            if not seen or seen[-1] != now:
                seen.append(now)
                print(now, flush=True)
            await asyncio.sleep(0.02)  # a process's calls, paced: not a timing assertion
    return 0 if len(seen) == 3 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:4])))
