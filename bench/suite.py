"""Decisions per second, latency and Redis commands per decision: ours beside every peer.

    python bench/suite.py [--seconds 2] [--rounds 3] [--loop asyncio|uvloop] [--only NAME]

Starts its own redis-server (or uses ``REDIS_URL``) and measures, in one run and one process,
at concurrency 1 and 64: our script engine with and without automatic pipelining, the command
engine with and without its lock, each algorithm (sliding log, the default; sliding window;
fixed window; GCRA), a cost from the call reserved and settled after it (a decision and a
settle per call, on the sliding log and the sliding window), the script engine with 10 000
overrides stored (half on the key measured, for other users), ``sync_rate=1``, the memory
backend and Postgres (a server started
here when PostgreSQL is installed, or ``POSTGRES_URL``), against ``limits`` (moving window
and sliding-window counter), ``throttled-py`` (sliding window, GCRA, token bucket) and
``pyrate-limiter`` (Redis bucket), all on redis-py, plus floors: our script sent bare
through ``evalsha``, and a bare ``INCRBY`` (the round trip throttled-py measures itself
against), each one call per decision and in pipelines of ``concurrency``.

Each decision is one admitted call for one of 10 000 users under ``user:1000/m`` (the
costlier path: checked and recorded). A row runs for ``--seconds``; with ``--rounds`` above
one the rows take turns, and each figure is the median of its rounds. Prints a Markdown table:
decisions/s, p50 and p99 latency, Redis commands per decision (``INFO commandstats``: those
run inside scripts included, scripts in brackets), the server's CPU time per decision
(``INFO cpu``), this process's CPU time per decision (``time.process_time``: the client
library, the event loop and this harness's own bookkeeping), Redis memory per user after
10 calls each (``MEMORY USAGE`` of its keys; the sliding log grows with the calls, the
others do not), and ours / the best peer at that concurrency. Peers come from the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import statistics
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import contenders as c
import redis.asyncio as aioredis

from tests.postgres_server import PostgresServer
from tests.redis_server import RedisServer

USERS = 10_000
LIMIT = 1_000
CONCURRENCY = (1, 64)

OURS: dict[str, c.Factory] = {
    "ratelimit: script": c.ours(auto_pipeline=False),
    "ratelimit: script, auto-pipelined (default)": c.ours(),
    "ratelimit: script, auto-pipelined, one script call per decision": c.ours(batch_scripts=False),
    "ratelimit: script, auto-pipelined, public API only": c.ours(fast_path=False),
    "ratelimit: script, public API only": c.ours(fast_path=False, auto_pipeline=False),
    "ratelimit: locked commands": c.ours(use_scripts=False),
    "ratelimit: unlocked commands": c.ours(use_scripts=False, disable_locks=True),
    "ratelimit: sliding window": c.ours(algorithm="sliding-window"),
    "ratelimit: reserve + settle (sliding log)": c.ours_settled(),
    "ratelimit: reserve + settle (sliding window)": c.ours_settled(algorithm="sliding-window"),
    "ratelimit: script, auto-pipelined, 10 000 overrides stored": c.ours_overridden(10_000),
    "ratelimit: fixed window": c.ours(algorithm="fixed-window"),
    "ratelimit: gcra": c.ours(algorithm="gcra"),
    "ratelimit: gcra, one script call per decision": c.ours(batch_scripts=False, algorithm="gcra"),
    "ratelimit: sync_rate=1 (sliding window)": c.ours(algorithm="sliding-window", sync_rate=1),
    "ratelimit: memory://": c.ours("memory://"),
}
PEERS: dict[str, c.Factory] = {
    "limits: moving window": c.limits_moving_window,
    "limits: sliding-window counter": c.limits_sliding_window,
    "throttled-py: sliding window": c.throttled_py("sliding_window"),
    "throttled-py: gcra": c.throttled_py("gcra"),
    "throttled-py: token bucket": c.throttled_py("token_bucket"),
    "pyrate-limiter: Redis bucket": c.pyrate_limiter,
}
FLOORS: dict[str, c.Factory] = {
    "floor: bare EVALSHA": c.bare_evalsha,
    "floor: bare EVALSHA, pipelined": c.bare_pipelined,
    "floor: bare INCRBY": c.bare_incrby_alone,
    "floor: bare INCRBY, pipelined": c.bare_incrby,
}


@dataclass
class Result:
    rates: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    commands: list[float] = field(default_factory=list)
    scripts: list[float] = field(default_factory=list)
    server_us: list[float] = field(default_factory=list)
    client_us: list[float] = field(default_factory=list)
    memory: list[float] = field(default_factory=list)
    batched: list[tuple[float, float]] = field(default_factory=list)
    """Per round: decisions per script call (mean), and the batch size the median decision
    went in."""

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


async def server_counts(client: aioredis.Redis) -> tuple[int, int, float]:
    """What the server has done so far: (commands run, inside scripts included; scripts
    run; its CPU seconds), not counting INFO itself."""
    stats = await client.info("commandstats")
    cpu = await client.info("cpu")
    commands = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")
    scripts = sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_eval"))
    return commands, scripts, cpu["used_cpu_user"] + cpu["used_cpu_sys"]


PROBE_USERS = 100
PROBE_HITS = 10


async def memory_per_user(contender: c.Contender, admin: aioredis.Redis) -> float:
    """Bytes of Redis memory per user after ``PROBE_HITS`` admitted calls each, for
    ``PROBE_USERS`` fresh users: ``MEMORY USAGE`` of every key holding the contender's
    prefix and a probe user's name, read at once (GCRA's keys expire as soon as their
    arrival time passes). NaN for a contender that keeps nothing in Redis."""
    if not contender.prefix:
        return math.nan
    users = [f"probe-{i}" for i in range(PROBE_USERS)]
    for _ in range(PROBE_HITS):
        await asyncio.gather(*(contender.decide(u) for u in users))
    keys = [k async for k in admin.scan_iter(match=f"*{contender.prefix}*probe-*", count=1000)]
    total = 0
    for start in range(0, len(keys), 1000):
        total += await _usage(admin, keys[start : start + 1000])
    return total / PROBE_USERS if total else math.nan


async def _usage(admin: aioredis.Redis, keys: list[bytes]) -> int:
    pipe = admin.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    return sum(n or 0 for n in await pipe.execute())


async def measure(
    contender: c.Contender, seconds: float, concurrency: int, admin: aioredis.Redis
) -> tuple[float, list[float], tuple[float, ...]]:
    """Run ``contender`` for ``seconds``: (decisions/s, latencies in s, and per decision:
    Redis commands, scripts, server CPU in µs, this process's CPU in µs)."""
    users = [f"user-{i}" for i in range(USERS)]  # USERS: --users
    await asyncio.gather(*(contender.decide(u) for u in users[:64]))  # pools, scripts, buckets
    latencies: list[float] = []
    counter = iter(range(64, 1 << 62))
    deadline = time.perf_counter() + seconds
    clock = time.perf_counter

    async def one_at_a_time() -> None:
        decide = contender.decide
        for i in counter:
            started = clock()
            if not await decide(users[i % USERS]):
                raise SystemExit(f"a decision was refused at call {i}: raise LIMIT")
            finished = clock()
            latencies.append(finished - started)
            if finished > deadline:
                return

    async def batches() -> None:
        assert contender.many is not None
        while True:
            batch = [users[next(counter) % USERS] for _ in range(concurrency)]
            started = clock()
            if not all(await contender.many(batch)):
                raise SystemExit("a decision was refused: raise LIMIT")
            finished = clock()
            latencies.extend([finished - started] * concurrency)
            if finished > deadline:
                return

    before = await server_counts(admin)
    sizes_before = Counter(contender.sizes or {})
    started, cpu_started = clock(), time.process_time()
    if contender.many is not None and concurrency > 1:
        await batches()
    else:
        await asyncio.gather(*(one_at_a_time() for _ in range(concurrency)))
    elapsed, cpu = clock() - started, time.process_time() - cpu_started
    after = await server_counts(admin)
    if contender.sizes is not None:
        contender.batched = batch_sizes(contender.sizes - sizes_before)
    n = len(latencies)
    per_decision = tuple((a - b) / n for a, b in zip(after, before, strict=True))
    server_us, client_us = per_decision[2] * 1e6, cpu / n * 1e6
    return n / elapsed, latencies, (per_decision[0], per_decision[1], server_us, client_us)


def batch_sizes(sizes: Counter[int]) -> tuple[float, float]:
    """Decisions per script call (mean), and the size of the batch the median decision
    went in."""
    calls = sum(sizes.values())
    decisions = sum(size * n for size, n in sizes.items())
    if not calls:
        return math.nan, math.nan
    seen, median = 0, 0
    for size in sorted(sizes):
        seen += size * sizes[size]
        if seen * 2 >= decisions:
            median = size
            break
    return decisions / calls, float(median)


async def main(url: str, seconds: float, rounds: int, only: str | None) -> None:
    contenders = {**OURS, **PEERS, **FLOORS}
    if only:
        contenders = {k: v for k, v in contenders.items() if only in k or k in PEERS}
    admin = aioredis.Redis.from_url(url)
    info = await admin.info("server")
    results = {(name, n): Result() for name in contenders for n in CONCURRENCY}
    for _ in range(rounds):
        for concurrency in CONCURRENCY:
            for name, factory in contenders.items():
                contender = await factory(url, LIMIT)
                try:
                    rate, latencies, (commands, scripts, server_us, client_us) = await measure(
                        contender, seconds, concurrency, admin
                    )
                    memory = await memory_per_user(contender, admin)
                finally:
                    await contender.close()
                quantiles = statistics.quantiles(latencies, n=100)
                result = results[(name, concurrency)]
                result.rates.append(rate)
                result.p50.append(quantiles[49] * 1e6)
                result.p99.append(quantiles[98] * 1e6)
                result.commands.append(commands)
                result.scripts.append(scripts)
                result.server_us.append(server_us)
                result.client_us.append(client_us)
                result.memory.append(memory)
                if contender.batched is not None:
                    result.batched.append(contender.batched)
                print(f"  {name} at {concurrency}: {rate:,.0f}/s", file=sys.stderr, flush=True)
    await admin.aclose()
    print(
        f"Redis {info['redis_version']} on 127.0.0.1, Python {platform.python_version()}, "
        f"{loop_name()} loop, {os.cpu_count()} cores ({platform.machine()}); "
        f"{seconds} s per row, median of {rounds} round(s); user:{LIMIT}/m over {USERS} users\n"
    )
    print(table(results, contenders))


def table(results: dict[tuple[str, int], Result], names: dict[str, c.Factory]) -> str:
    lines = [
        "| contender | concurrency | decisions/s | p50 µs | p99 µs | Redis commands "
        f"(scripts) per decision | Redis CPU µs per decision | client CPU µs per decision "
        f"| Redis bytes per user "
        f"({PROBE_HITS} hits) | decisions per script call (median decision's batch) "
        "| vs best peer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for concurrency in CONCURRENCY:
        best = max((results[(p, concurrency)].rate for p in PEERS if p in names), default=0.0)
        for name in names:
            r = results[(name, concurrency)]
            ratio = f"{r.rate / best:.2f}x" if best else "n/a"
            lines.append(
                f"| {name} | {concurrency} | {r.rate:,.0f} | {statistics.median(r.p50):,.0f} "
                f"| {statistics.median(r.p99):,.0f} | {statistics.median(r.commands):.2f} "
                f"({statistics.median(r.scripts):.2f}) | {statistics.median(r.server_us):.1f} "
                f"| {statistics.median(r.client_us):.1f} | {_memory(r)} | {_batched(r)} | {ratio} |"
            )
    return "\n".join(lines)


def _batched(r: Result) -> str:
    if not r.batched:
        return "n/a"
    mean = statistics.median(m for m, _ in r.batched)
    median = statistics.median(b for _, b in r.batched)
    return f"{mean:.1f} ({median:.0f})"


def _memory(r: Result) -> str:
    memory = statistics.median(r.memory)
    if math.isnan(memory):
        return "n/a"
    return f"{memory:,.0f}"


def loop_name() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--only", help="run only contenders whose name contains this")
    parser.add_argument("--users", type=int, default=USERS, help="distinct users (10 000)")
    return parser.parse_args()


def with_postgres(stack: ExitStack) -> None:
    """Rows on a PostgreSQL server started here (``POSTGRES_URL`` to use one), when its
    binaries are installed."""
    url = os.environ.get("POSTGRES_URL")
    if url is None:
        try:
            url = stack.enter_context(PostgresServer()).url
        except FileNotFoundError as exc:
            print(f"no Postgres rows: {exc}", file=sys.stderr)
            return
    OURS["ratelimit: postgres, sliding window"] = c.ours_postgres(url, algorithm="sliding-window")
    OURS["ratelimit: postgres, fixed window"] = c.ours_postgres(url, algorithm="fixed-window")
    OURS["ratelimit: postgres, sync_rate=1"] = c.ours_postgres(
        url, algorithm="sliding-window", sync_rate=1
    )


if __name__ == "__main__":
    options = parse()
    USERS = options.users
    with ExitStack() as stack:
        with_postgres(stack)
        url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        coroutine = main(url, options.seconds, options.rounds, options.only)
        if options.loop == "uvloop":
            import uvloop

            uvloop.run(coroutine)
        else:
            asyncio.run(coroutine)
