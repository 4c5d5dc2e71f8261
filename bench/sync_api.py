"""Decisions per second of the synchronous API (``ratelimit.sync``) in threads, beside
``limits``' synchronous strategies on the same Redis, at 1, 8 and 32 threads.

    python bench/sync_api.py [--seconds 2] [--rounds 3] [--threads 1,8,32] [--only TEXT]
    python bench/sync_api.py --memory     # memory:// beside limits' MemoryStorage

Starts its own redis-server (or uses ``REDIS_URL``); ``--memory`` runs every contender on its
in-process store instead. ``--only`` keeps the contenders whose name holds that text (the
baseline always runs). Each decision is one admitted call for
one of 10 000 users under ``user:1000/m`` (``limits``: ``1000/minute`` per user), made by
a plain function in a thread: ours decorated with ``@rl.limit`` (the user from its
argument), ``limits`` by ``strategy.hit``. Prints a Markdown table: decisions/s, p50 and
p99 latency, the process's CPU per decision, and ours as a multiple of ``limits``' moving
window (the exact equivalent of our default sliding log) at the same thread count.
Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ratelimit import RateLimitExceeded
from ratelimit.sync import RateLimit
from tests.redis_server import RedisServer

USERS = 10_000
LIMIT = 1000
Decide = Callable[[str], bool]


def ours(url: str, algorithm: str, **options: Any) -> tuple[Decide, Callable[[], None]]:
    rl = RateLimit.from_url(
        url, f"bench-sync-{uuid.uuid4().hex[:6]}", algorithm=algorithm, **options
    )

    @rl.limit(f"user:{LIMIT}/m")
    def work(user: str) -> None: ...

    def decide(user: str) -> bool:
        try:
            work(user)
        except RateLimitExceeded:
            return False
        return True

    return decide, rl.close


def limits_strategy(url: str, name: str) -> tuple[Decide, Callable[[], None]]:
    from limits import RateLimitItemPerMinute, strategies
    from limits.storage import MemoryStorage, RedisStorage, Storage

    storage: Storage = (
        MemoryStorage()
        if url.startswith("memory:")
        else RedisStorage(url, key_prefix=f"bench-{uuid.uuid4().hex[:6]}", max_connections=64)
    )
    limiter = getattr(strategies, name)(storage)
    item = RateLimitItemPerMinute(LIMIT)

    def decide(user: str) -> bool:
        return bool(limiter.hit(item, "work", user))

    def close() -> None:
        storage.reset()

    return decide, close


CONTENDERS: dict[str, Callable[[str], tuple[Decide, Callable[[], None]]]] = {
    "ratelimit.sync: sliding log (default)": lambda url: ours(url, "sliding-log"),
    "ratelimit.sync: gcra": lambda url: ours(url, "gcra"),
    "ratelimit.sync: fixed window": lambda url: ours(url, "fixed-window"),
    "ratelimit.sync: sliding log, a hook (decided on the loop)": lambda url: ours(
        url, "sliding-log", hooks=[lambda decision: None]
    ),
    "limits: moving window": lambda url: limits_strategy(url, "MovingWindowRateLimiter"),
    "limits: sliding-window counter": lambda url: limits_strategy(
        url, "SlidingWindowCounterRateLimiter"
    ),
    "limits: fixed window": lambda url: limits_strategy(url, "FixedWindowRateLimiter"),
}
BASELINE = "limits: moving window"


def run(decide: Decide, seconds: float, threads: int) -> tuple[float, list[float], float, float]:
    """Decisions/s, latencies, and CPU seconds of this process per decision: all of it, and
    the kernel's share (the system calls of the round trips and of the threads' hand-offs
    of the interpreter lock)."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads + 1)
    stop = time.perf_counter() + seconds + 1e9  # set for real once all are ready

    def worker(n: int) -> None:
        mine = latencies[n]
        i = n * 7919
        start.wait()
        while time.perf_counter() < stop:
            user = f"user-{i % USERS}"
            i += 1
            began = time.perf_counter()
            if not decide(user):
                raise RuntimeError("a call was refused: the benchmark measures admitted calls")
            mine.append(time.perf_counter() - began)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    times = os.times()
    began = time.perf_counter()
    stop = began + seconds
    start.wait()
    for thread in pool:
        thread.join()
    elapsed = time.perf_counter() - began
    after = os.times()
    user, system = after.user - times.user, after.system - times.system
    flat = [x for mine in latencies for x in mine]
    done = max(len(flat), 1)
    return len(flat) / elapsed, flat, (user + system) / done, system / done


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


Results = dict[tuple[str, int], list[tuple[float, list[float], float, float]]]


def measure(url: str, seconds: float, rounds: int, counts: list[int], only: str = "") -> Results:
    """Every contender (whose name holds ``only``, and the baseline) at each thread count
    in ``counts``, ``rounds`` times, on the store at ``url`` (also what ``bench/wsgi.py``
    runs for its table of the sync API alone)."""
    results: Results = {}
    for _ in range(rounds):  # rounds interleaved: noise hits every contender alike
        for name, make in CONTENDERS.items():
            if only not in name and name != BASELINE:
                continue
            decide, close = make(url)
            try:
                for threads in counts:
                    results.setdefault((name, threads), []).append(run(decide, seconds, threads))
            finally:
                close()
    return results


def print_table(results: Results, counts: list[int]) -> None:
    """The Markdown table of :func:`measure`'s results (medians of the rounds)."""
    print("| contender | threads | decisions/s | p50 µs | p99 µs | CPU µs per decision |"
          " of it in the kernel | vs limits' moving window |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for threads in counts:
        base = statistics.median(r[0] for r in results[(BASELINE, threads)])
        for name in CONTENDERS:
            if (name, threads) not in results:
                continue
            runs = results[(name, threads)]
            rate = statistics.median(r[0] for r in runs)
            median_run: Any = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
            _, lat, cpu, kernel = median_run
            print(
                f"| {name} | {threads} | {rate:,.0f} | {percentile(lat, 0.5) * 1e6:,.0f} | "
                f"{percentile(lat, 0.99) * 1e6:,.0f} | {cpu * 1e6:,.1f} | "
                f"{kernel * 1e6:,.1f} | {rate / base:.2f}x |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="1,8,32")
    parser.add_argument("--only", default="", help="contenders whose name holds this text")
    parser.add_argument("--memory", action="store_true", help="in-process stores, no Redis")
    args = parser.parse_args()
    counts = [int(n) for n in args.threads.split(",")]
    with ExitStack() as stack:
        if args.memory:
            url = "memory://"
        else:
            url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        print(
            f"Python {platform.python_version()}, {os.cpu_count()} cores, redis {url}; "
            f"{args.seconds} s per row, median of {args.rounds}; user:{LIMIT}/m over "
            f"{USERS} users\n"
        )
        results = measure(url, args.seconds, args.rounds, counts, args.only)
        print_table(results, counts)


if __name__ == "__main__":
    main()
