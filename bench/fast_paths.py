"""Do the single-rule shortcuts pay? Decisions per second with and without them.

The memory backend and ``sync_rate`` decide one rule without walking a tree (on
``memory://`` the direct path's inline admission, ``backends/memory/admit.py``;
``SyncedBackend._decide_one``). This runs the same
single-rule limit over 1 000 users in process, once as shipped and once with the shortcut
replaced by the general path, and prints the ratio. No Redis is needed (the synced backend's
decisions are local; its remote is fakeredis and never synced during the run).

    python3 bench/fast_paths.py [--seconds 0.3] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable

import fakeredis

from ratelimit import MemoryBackend, RateLimit
from ratelimit.backends import RedisScriptBackend
from ratelimit.backends.synced import SyncedBackend
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan


class GeneralMemory(MemoryBackend):
    async def decide(self, plan: Plan) -> Decision:  # no admitter: the direct path asks this
        return await super().decide(plan)

    def _decide_one(self, plan: Plan, now: int) -> Decision:
        return self._decide_logs(plan, now)


class GeneralSynced(SyncedBackend):
    def _decide_one(self, plan: Plan, now: int) -> Decision:
        return self._decide_tree(plan, now)


def memory(general: bool) -> RateLimit:
    return RateLimit(GeneralMemory() if general else MemoryBackend(), "b", denial_cache=0)


def synced(general: bool) -> RateLimit:
    remote = RedisScriptBackend(fakeredis.FakeAsyncRedis())
    backend = (GeneralSynced if general else SyncedBackend)(remote, 3600)
    return RateLimit(backend, "b", algorithm="sliding-window", denial_cache=0)


async def rate(
    make: Callable[[bool], RateLimit], general: bool, seconds: float, rounds: int
) -> float:
    rl = make(general)

    @rl.limit("user:100000/m")
    async def work(user: str) -> bool:
        return True

    users = [f"u{i}" for i in range(1000)]
    for user in users:
        await work(user)
    rates = []
    for _ in range(rounds):
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            for user in users:
                await work(user)
            n += len(users)
        rates.append(n / (time.perf_counter() - start))
    await rl.aclose()
    return statistics.median(rates)


async def main(seconds: float, rounds: int) -> None:
    print("| backend | with the shortcut | general path | ratio |")
    print("|---|---:|---:|---:|")
    for name, make in (("memory://, sliding log", memory), ("sync_rate, sliding window", synced)):
        fast = await rate(make, False, seconds, rounds)
        general = await rate(make, True, seconds, rounds)
        print(f"| {name} | {fast:,.0f}/s | {general:,.0f}/s | {fast / general:.2f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.rounds))
