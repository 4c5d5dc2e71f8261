"""Window counters against the sliding log: accuracy, memory, and the speed of ``sync_rate``.

    python bench/bench_counters.py [--requests 1000000] [--sources 10000] [--calls 20000]

1. Accuracy: synthetic traces (see ``trace``: a typical mix, and one with every source near
   its limit), each source limited by ``src:20/m``, decided by the exact sliding log and by
   the sliding window, both in memory on the trace's own clock. Reports the share of
   requests decided differently (Cloudflare reported 0.003% on their traffic), split into
   false denials and false admissions.
2. Memory: ``MEMORY USAGE`` of one identifier under ``100000/h`` after 100 000 hits, log
   against counter, on a private redis-server.
3. Speed: decisions per second at concurrency 64, ``sync_rate=1`` (``10 * --calls`` calls)
   against ``sync_rate=0`` (``--calls`` calls), sliding window, same Redis.
4. Overshoot: 4 processes share ``100/10s`` with ``sync_rate=1`` for 3 s; how many calls
   they admit in all, against 100 with ``sync_rate=0``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis.asyncio as aioredis

from ratelimit import MemoryBackend, RateLimit
from ratelimit.core.plan import cached_plan, compile_tree
from ratelimit.rules.tree import to_tree
from tests.redis_server import RedisServer

RULE = "src:20/m"


def trace(requests: int, sources: int, mix: str, seed: int = 7) -> list[tuple[float, int]]:
    """(time in seconds, source) for about ``requests`` requests under ``src:20/m``.

    ``typical``: 95% of sources steady well under the limit (0.05 to 0.8 of it), 5% abusive
    (2 to 10 times it), half of those in bursts. ``near-limit``: every source between 0.3
    and 1.7 times the limit, half of them bursty: the hardest case for an approximation.
    """
    rng = random.Random(seed)
    limit_rate = 20 / 60
    factors = (
        [
            rng.uniform(0.05, 0.8) if rng.random() < 0.95 else rng.uniform(2, 10)
            for _ in range(sources)
        ]
        if mix == "typical"
        else [rng.uniform(0.3, 1.7) for _ in range(sources)]
    )
    duration = requests / (limit_rate * sum(factors))
    events: list[tuple[float, int]] = []
    for source, factor in enumerate(factors):
        rate = limit_rate * factor
        bursty = (factor > 1.5 and source % 2 == 1) or (mix == "near-limit" and source % 2 == 1)
        t = rng.uniform(0, 60)
        while t < duration:
            if bursty and rng.random() < 0.05:
                t += rng.expovariate(rate / 8)  # a quiet spell
                for _ in range(rng.randint(5, 40)):  # then a burst
                    events.append((t, source))
                    t += rng.expovariate(rate * 6)
            else:
                events.append((t, source))
                t += rng.expovariate(rate)
    events.sort()
    return events


async def decisions(events: list[tuple[float, int]], algorithm: str) -> list[bool]:
    clock = [0.0]
    backend = MemoryBackend(clock=lambda: clock[0], sweep_every=50_000)
    compiled = compile_tree(to_tree(RULE))
    out = []
    for t, source in events:
        clock[0] = t
        plan = cached_plan(compiled, "acc", "k", (str(source),), 1, algorithm)
        out.append((await backend.decide(plan)).allowed)
    return out


async def estimator_error(events: list[tuple[float, int]]) -> tuple[int, int]:
    """The sliding window decides; at every request the exact count over the same admitted
    history is taken too. Returns (false denials, false admissions): the estimator's own
    error, which is what Cloudflare's figure measures."""
    clock = [0.0]
    backend = MemoryBackend(clock=lambda: clock[0], sweep_every=50_000)
    compiled = compile_tree(to_tree(RULE))
    history: dict[int, deque[float]] = {}
    false_denials = false_admissions = 0
    for t, source in events:
        clock[0] = t
        plan = cached_plan(compiled, "est", "k", (str(source),), 1, "sliding-window")
        allowed = (await backend.decide(plan)).allowed
        admitted = history.setdefault(source, deque())
        while admitted and admitted[0] <= t - 60:
            admitted.popleft()
        exact = len(admitted) + 1 <= 20
        false_denials += exact and not allowed
        false_admissions += allowed and not exact
        if allowed:
            admitted.append(t)
    return false_denials, false_admissions


async def counting_every_request(events: list[tuple[float, int]]) -> tuple[int, int]:
    """Cloudflare's method: every request counts, refused ones too (Kong's ``increment``);
    a request is over the limit when its source's rate exceeds 20 a minute. Returns the
    requests the sliding window wrongly calls over / under, against the exact count."""
    clock = [0.0]
    rl = RateLimit(MemoryBackend(clock=lambda: clock[0], sweep_every=50_000), "cf")
    seen: dict[int, deque[float]] = {}
    wrongly_over = wrongly_under = 0
    for t, source in events:
        clock[0] = t
        over = await rl.increment(str(source), 60) > 20
        requests = seen.setdefault(source, deque())
        requests.append(t)
        while requests[0] <= t - 60:
            requests.popleft()
        exact = len(requests) > 20
        wrongly_over += over and not exact
        wrongly_under += exact and not over
    return wrongly_over, wrongly_under


async def accuracy(requests: int, sources: int, mix: str) -> None:
    started = time.perf_counter()
    events = trace(requests, sources, mix)
    exact = await decisions(events, "sliding-log")
    approx = await decisions(events, "sliding-window")
    false_denials = sum(e and not a for e, a in zip(exact, approx, strict=True))
    false_admissions = sum(a and not e for e, a in zip(exact, approx, strict=True))
    print(
        f"accuracy ({mix}): {len(events)} requests from {sources} sources under {RULE}, "
        f"{100 * (1 - sum(exact) / len(exact)):.1f}% denied by the exact log, "
        f"admitted: log {sum(exact)}, sliding window {sum(approx)}"
    )
    print(
        f"  decided differently: {100 * (false_denials + false_admissions) / len(events):.4f}% "
        f"(false denials {100 * false_denials / len(events):.4f}%, "
        f"false admissions {100 * false_admissions / len(events):.4f}%), each on its own history"
    )
    denials, admissions = await estimator_error(events)
    print(
        f"  estimator error on one history: {100 * (denials + admissions) / len(events):.4f}% "
        f"(false denials {100 * denials / len(events):.4f}%, "
        f"false admissions {100 * admissions / len(events):.4f}%)"
    )
    over, under = await counting_every_request(events)
    print(
        f"  counting every request (Cloudflare's method): "
        f"{100 * (over + under) / len(events):.4f}% wrong "
        f"(wrongly limited {100 * over / len(events):.4f}%, "
        f"wrongly let through {100 * under / len(events):.4f}%) "
        f"[{time.perf_counter() - started:.0f} s]"
    )


async def memory(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    for algorithm in ("sliding-log", "sliding-window"):
        namespace = f"mem-{uuid.uuid4().hex[:6]}"
        rl = RateLimit(client, namespace, algorithm=algorithm)
        limit = rl.limit("100000/h", key="k", cost=1000)
        for _ in range(100):
            assert (await limit.decide()).allowed
        key = f"rl:{{{namespace}:k}}" + ("" if algorithm == "sliding-log" else ":w")
        usage = await client.memory_usage(key, samples=0)
        print(f"memory: {algorithm:<15} 100000/h after 100000 hits: {usage} bytes per identifier")
    await client.aclose()


NAMES = [f"user-{i}" for i in range(1000)]


async def runner(queue: Iterator[int], work: Callable[[str], Awaitable[None]]) -> None:
    for i in queue:
        await work(NAMES[i % 1000])


async def speed(url: str, calls: int) -> None:
    rates = {}
    for sync_rate in (0.0, 1.0):
        client = aioredis.Redis.from_url(url, max_connections=128)
        rl = RateLimit(
            client, f"speed-{uuid.uuid4().hex[:6]}", algorithm="sliding-window", sync_rate=sync_rate
        )

        @rl.limit("user:1000000/m")
        async def work(user: str) -> None:
            return None

        count = calls if sync_rate == 0 else 10 * calls  # long enough to measure either way
        queue = iter(range(count))

        started = time.perf_counter()
        await asyncio.gather(*(runner(queue, work) for _ in range(64)))
        rates[sync_rate] = count / (time.perf_counter() - started)
        await rl.aclose()
        await client.aclose()
    print(
        f"speed: concurrency 64, sync_rate=0 {rates[0.0]:.0f}/s, sync_rate=1 {rates[1.0]:.0f}/s, "
        f"ratio {rates[1.0] / rates[0.0]:.1f}"
    )


OVERSHOOT_WORKER = """
import asyncio, sys, time
import redis.asyncio as aioredis
from ratelimit import RateLimit
async def main(url, namespace, sync_rate):
    client = aioredis.Redis.from_url(url)
    rl = RateLimit(client, namespace, algorithm="sliding-window", sync_rate=sync_rate)
    limit = rl.limit("100/10s", key="shared")
    control = aioredis.Redis.from_url(url)
    await control.blpop([namespace + ":go"], timeout=30)
    admitted, end = 0, time.monotonic() + 3
    while time.monotonic() < end:
        admitted += (await limit.decide()).allowed
        await asyncio.sleep(0.001)
    await rl.aclose()
    print(admitted)
asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


async def overshoot(url: str) -> None:
    for sync_rate in (0.0, 1.0):
        namespace = f"over-{uuid.uuid4().hex[:6]}"
        workers = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-c", OVERSHOOT_WORKER, url, namespace, str(sync_rate),
                stdout=asyncio.subprocess.PIPE,
            )
            for _ in range(4)
        ]  # fmt: skip
        client = aioredis.Redis.from_url(url)
        await asyncio.sleep(1.0)  # let the workers start and block on the go signal
        await client.rpush(f"{namespace}:go", *["go"] * 4)
        counts = [int((await w.communicate())[0]) for w in workers]
        await client.aclose()
        print(
            f"overshoot: 4 processes x 3 s on 100/10s, sync_rate={sync_rate:g}: "
            f"{sum(counts)} admitted {counts}"
        )


async def main(url: str, calls: int, requests: int, sources: int) -> None:
    await memory(url)
    await speed(url, calls)
    await overshoot(url)
    for mix in ("typical", "near-limit"):
        await accuracy(requests, sources, mix)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--sources", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=20_000)
    options = parser.parse_args()
    with ExitStack() as stack:
        url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        asyncio.run(main(url, options.calls, options.requests, options.sources))
