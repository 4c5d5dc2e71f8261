"""In-process decisions per second: ours on ``memory://`` beside the peers' in-memory stores.

    python bench/in_process.py [--seconds 1] [--rounds 5] [--only NAME]

No server: every contender keeps its counters in this process. Ours is the decorator as
users write it (``@rl.limit("user:1000/m")``, the user from the call's argument), once per
algorithm, then on the default algorithm with what users add to it (:data:`PATHS`: hooks,
metrics, ``penalty=``, ``settle=``, a cost callable, tiers); the peers are ``limits``
(``limits.aio``'s ``MemoryStorage``: moving window, fixed window, sliding-window counter)
and ``throttled-py`` (``throttled.asyncio``'s ``MemoryStore``: every algorithm it offers),
each called as its documentation shows. Each decision is one admitted call for one of
10 000 users under 1000 calls a minute, at concurrency 1 (one coroutine) and 64 (64
coroutines at once). Rows take turns for ``--rounds`` rounds; each figure is the median.
Prints a Markdown table: decisions/s, this process's CPU per decision
(``time.process_time``), and ours as a multiple of the fastest peer at that concurrency
(every peer algorithm counted). Figures are reported, never
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ratelimit import RateLimit

USERS = 10_000
LIMIT = 1_000
CONCURRENCY = (1, 64)
Decide = Callable[[str], Awaitable[bool]]
Factory = Callable[[], Decide]


def ours(algorithm: str) -> Factory:
    def factory() -> Decide:
        rl = RateLimit.from_url("memory://", algorithm=algorithm)

        @rl.limit(f"user:{LIMIT}/m")
        async def work(user: str) -> bool:
            return True

        return work

    return factory


def with_path(path: str) -> Factory:
    """Ours on the default algorithm, stepped off the plain limit the way users do: a hook
    (one that does nothing, ``PrometheusHook``, ``OpenTelemetryHook``), ``penalty=``,
    ``settle=`` (each call reserves 2 and settles 1: a refund written per call), a cost
    callable, or rules chosen per call (tiers)."""

    def factory() -> Decide:
        settings: dict[str, Any] = {}
        if path == "no-op hook":
            settings["hooks"] = [lambda decision: None]
        elif path == "PrometheusHook":
            from prometheus_client import CollectorRegistry

            from ratelimit.metrics.prometheus import PrometheusHook

            settings["hooks"] = [PrometheusHook(CollectorRegistry())]
        elif path == "OpenTelemetryHook":
            from opentelemetry.sdk.metrics import MeterProvider

            from ratelimit.metrics.opentelemetry import OpenTelemetryHook

            settings["hooks"] = [OpenTelemetryHook(MeterProvider().get_meter("bench"))]
        rl = RateLimit.from_url("memory://", **settings)
        rules: str | dict[str, str] = f"user:{LIMIT}/m"
        given: dict[str, dict[str, Any]] = {
            "penalty=": {"penalty": "5 refusals/10m for 1h"},
            "settle=": {"cost": 2, "settle": lambda result: 1},
            "cost callable": {"cost": lambda user: 1},
        }
        options = given.get(path, {})
        if path == "tiers":
            rules = {"free": f"user:{LIMIT}/m", "pro": f"user:{10 * LIMIT}/m"}
            options = {"tier": lambda: "free"}

        async def work(user: str) -> bool:
            return True

        decide: Decide = rl.limit(rules, **options)(work)
        return decide

    return factory


def limits_strategy(name: str) -> Factory:
    def factory() -> Decide:
        from limits import RateLimitItemPerMinute
        from limits.aio import strategies
        from limits.aio.storage import MemoryStorage

        limiter = getattr(strategies, name)(MemoryStorage())
        item = RateLimitItemPerMinute(LIMIT)

        async def decide(user: str) -> bool:
            allowed: bool = await limiter.hit(item, "work", user)
            return allowed

        return decide

    return factory


def throttled_py(using: str) -> Factory:
    def factory() -> Decide:
        from throttled.asyncio import MemoryStore, Throttled, per_min

        throttle = Throttled(using=using, quota=per_min(LIMIT), store=MemoryStore())

        async def decide(user: str) -> bool:
            result = await throttle.limit(user)
            return not result.limited

        return decide

    return factory


PATHS = (
    "no-op hook",
    "PrometheusHook",
    "OpenTelemetryHook",
    "penalty=",
    "settle=",
    "cost callable",
    "tiers",
)
OURS: dict[str, Factory] = {
    "ratelimit: sliding log (default)": ours("sliding-log"),
    "ratelimit: gcra": ours("gcra"),
    "ratelimit: sliding window": ours("sliding-window"),
    "ratelimit: fixed window": ours("fixed-window"),
    **{f"ratelimit: sliding log + {path}": with_path(path) for path in PATHS},
}
PEERS: dict[str, Factory] = {
    "limits: moving window": limits_strategy("MovingWindowRateLimiter"),
    "limits: fixed window": limits_strategy("FixedWindowRateLimiter"),
    "limits: sliding-window counter": limits_strategy("SlidingWindowCounterRateLimiter"),
    "throttled-py: gcra": throttled_py("gcra"),
    "throttled-py: sliding window": throttled_py("sliding_window"),
    "throttled-py: fixed window": throttled_py("fixed_window"),
    "throttled-py: token bucket": throttled_py("token_bucket"),
    "throttled-py: leaking bucket": throttled_py("leaking_bucket"),
}


async def measure(decide: Decide, seconds: float, concurrency: int) -> tuple[float, float]:
    """(decisions/s, client CPU µs per decision) of ``decide`` for ``seconds``."""
    users = [f"user-{i}" for i in range(USERS)]
    for user in users:  # every user's state exists: the run measures steady decisions
        await decide(user)
    counter = iter(range(1 << 62))
    done = 0
    clock = time.perf_counter
    deadline = clock() + seconds

    async def worker() -> None:
        nonlocal done
        n = 0
        for i in counter:
            if not await decide(users[i % USERS]):
                raise SystemExit(f"a decision was refused at call {i}: raise LIMIT")
            n += 1
            if n % 64 == 0 and clock() > deadline:
                break
        done += n

    gc.collect()
    started, cpu = clock(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed, cpu = clock() - started, time.process_time() - cpu
    return done / elapsed, cpu / done * 1e6


async def main(seconds: float, rounds: int, only: str | None) -> None:
    contenders = {**OURS, **PEERS}
    if only:
        contenders = {k: v for k, v in contenders.items() if only in k or k in PEERS}
    rates: dict[tuple[str, int], list[float]] = {}
    cpus: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for concurrency in CONCURRENCY:
            for name, factory in contenders.items():
                rate, cpu = await measure(factory(), seconds, concurrency)
                rates.setdefault((name, concurrency), []).append(rate)
                cpus.setdefault((name, concurrency), []).append(cpu)
                print(f"  {name} at {concurrency}: {rate:,.0f}/s", file=sys.stderr, flush=True)
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} cores ({platform.machine()}); "
        f"{seconds} s per row, median of {rounds} round(s); {LIMIT}/m over {USERS} users\n"
    )
    print(
        "| contender | concurrency | decisions/s | client CPU µs per decision "
        "| ours / fastest peer |"
    )
    print("|---|---|---|---|---|")
    for concurrency in CONCURRENCY:
        best = max(
            statistics.median(rates[(name, concurrency)]) for name in contenders if name in PEERS
        )
        for name in contenders:
            rate = statistics.median(rates[(name, concurrency)])
            cpu = statistics.median(cpus[(name, concurrency)])
            ratio = f"**{rate / best:.2f}x**" if name in OURS else ""
            print(f"| {name} | {concurrency} | {rate:,.0f} | {cpu:.1f} | {ratio} |")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", help="run only ours whose name contains this (and the peers)")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse()
    asyncio.run(main(args.seconds, args.rounds, args.only))
