"""One limit's identifiers kept in one slot (pinned) or spread over a Redis Cluster's nodes:
decisions per second, Redis CPU per decision and each node's share of the calls.

    python bench/cluster.py [--seconds 3] [--rounds 2] [--concurrency 64] [--algorithms ...]

Starts its own servers: a plain redis-server, a cluster of one node and a cluster of three
(``tests.redis_server``; ``RATELIMIT_REDIS_SERVER`` picks the build). On each, the script
engine decides ``user:1000/m`` for 10 000 users round-robin (every call admitted) from
``--concurrency`` coroutines of one process, ``spread=False`` (every key of the limit in
the slot of its (namespace, key): one node works, and calls ready together go as one
batch script) beside ``spread=True`` (each user's keys under a hash tag of their own:
spread over the slots and nodes, one script call per decision). Prints one Markdown table:
decisions/s; script calls per decision; the Redis CPU per decision, summed over the nodes,
as the scripts' own time (``INFO commandstats`` usec of ``EVALSHA``) and as the servers'
whole CPU (``INFO cpu`` user + sys deltas: networking and the event loop too); each node's
share of the script calls; this process's CPU per decision (``time.process_time``).
With ``--rounds`` above one the rows take turns and each figure is the median of its
rounds. ``--rules`` decides another tree: ``--rules "user:1000/m | 10000000/m"`` spans the
user's slot and the key's where keys spread (decided by parts: two script calls per
decision), beside the same tree pinned. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from ratelimit import RateLimit, RateLimitExceeded
from tests.redis_server import RedisCluster, RedisServer

USERS = 10_000
LIMIT = 1000
LAYOUTS = {"pinned": False, "spread": True}
RUN = uuid.uuid4().hex[:6]


@dataclass
class Store:
    """A server or cluster to measure on: its URL and every master's port."""

    name: str
    url: str
    ports: list[int]
    cluster: bool


@dataclass
class Row:
    rates: list[float] = field(default_factory=list)
    scripts: list[float] = field(default_factory=list)
    script_us: list[float] = field(default_factory=list)
    server_us: list[float] = field(default_factory=list)
    client_us: list[float] = field(default_factory=list)
    shares: list[list[float]] = field(default_factory=list)


def node_counts(ports: list[int]) -> list[tuple[int, float, float]]:
    """Per node: (script calls, their usec, its CPU seconds: user + sys)."""
    counts = []
    for port in ports:
        node: Any = redis.Redis(port=port)
        stats = node.info("commandstats")
        cpu = node.info("cpu")
        node.close()
        scripts = [v for k, v in stats.items() if k.startswith("cmdstat_eval")]
        counts.append(
            (
                sum(int(v["calls"]) for v in scripts),
                sum(float(v["usec"]) for v in scripts),
                float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            )
        )
    return counts


def reset_stats(ports: list[int]) -> None:
    for port in ports:
        node: Any = redis.Redis(port=port)
        node.config_resetstat()
        node.close()


async def measure(
    store: Store, algorithm: str, spread: bool, seconds: float, concurrency: int, rules: str
) -> tuple[float, float, float, float, float, list[float]]:
    """(decisions/s, script calls, script usec, server CPU usec and client CPU usec per
    decision, each node's share of the script calls) of one run of ``seconds``."""
    client: Any = (
        AsyncRedisCluster.from_url(store.url)
        if store.cluster
        else aioredis.Redis.from_url(store.url)
    )
    # one namespace per row in every round: a pinned row's slot stays on one node
    namespace = f"bench-cluster-{RUN}-{algorithm}-{spread}"
    rl = RateLimit(client, namespace, algorithm=algorithm, spread=spread)

    @rl.limit(rules, key="bench")
    async def work(user: str) -> None: ...

    users = [f"user-{i}" for i in range(USERS)]
    await asyncio.gather(*(work(u) for u in users[:concurrency]))  # pools, scripts, slots
    counter = iter(range(concurrency, 1 << 62))
    decisions = 0
    deadline = time.perf_counter() + seconds

    async def one_at_a_time() -> None:
        nonlocal decisions
        for i in counter:
            try:
                await work(users[i % USERS])
            except RateLimitExceeded:
                raise SystemExit(f"a decision was refused at call {i}: raise LIMIT") from None
            decisions += 1
            if time.perf_counter() > deadline:
                return

    reset_stats(store.ports)
    before = node_counts(store.ports)
    started, cpu_started = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one_at_a_time() for _ in range(concurrency)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    after = node_counts(store.ports)
    await rl.aclose()
    await client.aclose()
    calls = [a[0] for a in after]  # RESETSTAT zeroed the command stats, not the CPU
    total = sum(calls) or 1
    server = sum(a[2] - b[2] for a, b in zip(after, before, strict=True))
    return (
        decisions / elapsed,
        sum(calls) / decisions,
        sum(a[1] for a in after) / decisions,
        server / decisions * 1e6,
        cpu / decisions * 1e6,
        [n / total for n in calls],
    )


async def run(
    stores: list[Store],
    algorithms: list[str],
    seconds: float,
    rounds: int,
    concurrency: int,
    rules: str,
) -> dict[tuple[str, str, str], Row]:
    rows: dict[tuple[str, str, str], Row] = {}
    for _ in range(rounds):  # rounds interleaved: noise hits every row alike
        for store in stores:
            for algorithm in algorithms:
                for layout, spread in LAYOUTS.items():
                    result = await measure(store, algorithm, spread, seconds, concurrency, rules)
                    row = rows.setdefault((store.name, algorithm, layout), Row())
                    rate, scripts, script_us, server_us, client_us, shares = result
                    row.rates.append(rate)
                    row.scripts.append(scripts)
                    row.script_us.append(script_us)
                    row.server_us.append(server_us)
                    row.client_us.append(client_us)
                    row.shares.append(shares)
                    print(
                        f"  {store.name} {algorithm} {layout}: {rate:,.0f}/s",
                        file=sys.stderr,
                        flush=True,
                    )
    return rows


def print_table(rows: dict[tuple[str, str, str], Row]) -> None:
    print(
        "| store | algorithm | layout | decisions/s | script calls per decision "
        "| Redis script µs per decision | Redis CPU µs per decision "
        "| each node's share of script calls | client CPU µs per decision |"
    )
    print("|---|---|---|---:|---:|---:|---:|---|---:|")
    for (store, algorithm, layout), row in rows.items():
        median = statistics.median
        shares = [median(s[n] for s in row.shares) for n in range(len(row.shares[0]))]
        print(
            f"| {store} | {algorithm} | {layout} | {median(row.rates):,.0f} "
            f"| {median(row.scripts):.2f} | {median(row.script_us):.1f} "
            f"| {median(row.server_us):.1f} | {' / '.join(f'{s:.0%}' for s in shares)} "
            f"| {median(row.client_us):.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--algorithms", default="sliding-log,gcra")
    parser.add_argument("--rules", default=f"user:{LIMIT}/m")
    args = parser.parse_args()
    with ExitStack() as stack:
        server = stack.enter_context(RedisServer())
        one = stack.enter_context(RedisCluster(nodes=1))
        three = stack.enter_context(RedisCluster(nodes=3))
        stores = [
            Store("redis (one server)", server.url, [server.port], cluster=False),
            Store("cluster of 1", one.url, [s.port for s in one.servers], cluster=True),
            Store("cluster of 3", three.url, [s.port for s in three.servers], cluster=True),
        ]
        print(
            f"Redis {server.version()}, Python {platform.python_version()}, "
            f"{os.cpu_count()} cores ({platform.machine()}); one process, concurrency "
            f"{args.concurrency}; {args.seconds} s per row, median of {args.rounds} round(s); "
            f"{args.rules} over {USERS} users\n"
        )
        rows = asyncio.run(
            run(
                stores,
                args.algorithms.split(","),
                args.seconds,
                args.rounds,
                args.concurrency,
                args.rules,
            )
        )
        print_table(rows)


if __name__ == "__main__":
    main()
