"""What ``penalty=`` costs per decision: unused (a limit without one), used but not held
(every call admitted: the hold is read before each decision), and a held client (answered
from the process's memory of the hold, asking the store once a second).

On memory:// and on a private redis-server (``tests.redis_server``; ``REDIS_URL`` to use
another), one coroutine deciding one identifier after another, as a decorated function
would be called. Prints decisions per second and client CPU per decision
(``time.process_time``), the median of ``--rounds`` rounds of ``--seconds`` each, the rows
taking turns round by round.

    python3 bench/bench_penalties.py [--seconds 0.5] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ratelimit import RateLimit
from ratelimit.core.plan import compile_tree
from ratelimit.rules.tree import to_tree
from tests.redis_server import RedisServer

PENALTY = "5 refusals/10m for 1h"


async def measure(call: Callable[[int], Awaitable[object]], seconds: float) -> tuple[float, float]:
    """Decisions per second and client CPU microseconds per decision, calling ``call(n)``."""
    n = 0
    wall, cpu = time.perf_counter(), time.process_time()
    deadline = wall + seconds
    while time.perf_counter() < deadline:
        for _ in range(100):
            await call(n)
            n += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return n / wall, cpu / n * 1e6


async def cases(url: str, seconds: float, rounds: int) -> None:
    rl = RateLimit.from_url(url, namespace=f"bench-penalties-{uuid.uuid4().hex[:8]}")
    many = 100_000  # per ip of 1 000: every call admitted

    @rl.limit(f"ip:{many}/h", key="plain")
    async def plain(ip: str) -> None: ...

    @rl.limit(f"ip:{many}/h", key="penalized", penalty=PENALTY)
    async def penalized(ip: str) -> None: ...

    held = rl.limit("ip:1/h", key="held", ip="203.0.113.9", penalty=PENALTY)
    for _ in range(7):  # one admitted, five refusals start the hold
        await held.decide()
    assert (await held.decide()).penalty is not None

    async def held_call(n: int) -> None:
        await held.decide()

    tree = compile_tree(to_tree(f"ip:{many}/h"))
    runs: dict[str, Callable[[int], Awaitable[object]]] = {
        "decorator, no penalty": lambda n: plain(str(n % 1000)),
        "decorator, penalty, admitted": lambda n: penalized(str(n % 1000)),
        "rl.decide, no penalty": lambda n: rl.decide(tree, "door", (str(n % 1000),)),
        "rl.decide, penalty, admitted": lambda n: rl.decide(
            tree, "door", (str(n % 1000),), penalty=PENALTY
        ),
        "penalty, a held client": held_call,
    }
    print(f"{url.split(':')[0]}://")
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(rounds):  # the rows take turns: a machine's drift reaches each alike
        for name, call in runs.items():
            results[name].append(await measure(call, seconds))
    for name, measured in results.items():
        rate = statistics.median(r[0] for r in measured)
        cpu = statistics.median(r[1] for r in measured)
        print(f"  {name:32} {rate:10,.0f} decisions/s  {cpu:7.1f} us CPU/decision")
    await rl.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(cases("memory://", args.seconds, args.rounds))
    with contextlib.ExitStack() as stack:
        url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        asyncio.run(cases(url, args.seconds, args.rounds))


if __name__ == "__main__":
    main()
