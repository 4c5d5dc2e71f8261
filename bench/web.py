"""Requests per second of one FastAPI application under uvicorn: no limiter, ours, slowapi and
fastapi-limiter, on the same route and the same Redis, as ratios to no limiter.

    python bench/web.py [--seconds 5] [--rounds 3] [--connections 32] [--only NAME]

Starts its own redis-server (or uses ``REDIS_URL``) and one uvicorn process per contender
(``bench/http_apps.py``: ``GET /ping``, 1000 a minute per ``X-API-Key``; uvloop and
httptools, one worker, no access log). The load comes from this process: ``--connections``
keep-alive HTTP/1.1 connections on a small raw-socket client (cheaper per request than any
server here), spreading requests over 1000 keys so that nothing is refused (a contender
that refuses or fails any request is reported). With ``--rounds`` above one the contenders
take turns, and each figure is the median of its rounds. Prints a Markdown table.
``--gc-freeze`` has each application call ``gc.freeze()`` once built (see the README).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.http_server import UvicornServer
from tests.redis_server import RedisServer

CONTENDERS = {
    "no limiter": "none",
    "no limiter, a dependency that does nothing": "none-dependency",
    "no limiter, a dependency that awaits one Redis INCR": "redis-dependency",
    "ratelimit: middleware (sliding log)": "ratelimit",
    "ratelimit: RouteLimit dependency": "ratelimit-dependency",
    "ratelimit: middleware, fixed window": "ratelimit-fixed",
    "slowapi (fixed window)": "slowapi",
    "fastapi-limiter (pyrate-limiter Redis bucket)": "fastapi-limiter",
}
KEYS = [f"key-{n}".encode() for n in range(1000)]


async def connection(
    port: int, deadline: float, offset: int, latencies: list[float], statuses: Counter[int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    n = offset
    try:
        while time.perf_counter() < deadline:
            key = KEYS[n % len(KEYS)]
            n += 7
            started = time.perf_counter()
            writer.write(b"GET /ping HTTP/1.1\r\nHost: bench\r\nX-API-Key: " + key + b"\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            statuses[int(head[9:12])] += 1
    finally:
        writer.close()


async def load(
    port: int, seconds: float, connections: int
) -> tuple[float, list[float], Counter[int]]:
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    await asyncio.gather(
        *(connection(port, deadline, i, latencies, statuses) for i in range(connections))
    )
    return len(latencies) / (time.perf_counter() - started), latencies, statuses


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--only", help="measure only contenders whose name contains this")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() in each app once it is built"
    )
    args = parser.parse_args()
    chosen = {
        name: app
        for name, app in CONTENDERS.items()
        if args.only is None or args.only in name or app == "none"
    }
    run = uvloop.run  # the bench extra has it
    with ExitStack() as stack:
        url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        servers = {
            name: stack.enter_context(
                UvicornServer(
                    "bench.http_apps:app",
                    {"BENCH_APP": app, "BENCH_REDIS": url}
                    | ({"BENCH_GC_FREEZE": "1"} if args.gc_freeze else {}),
                    factory=True,
                    extra=["--loop", "uvloop", "--http", "httptools", "--no-access-log"],
                    ready_path="/openapi.json",
                )
            )
            for name, app in chosen.items()
        }
        rates: dict[str, list[float]] = {name: [] for name in chosen}
        p50s: dict[str, list[float]] = {name: [] for name in chosen}
        p99s: dict[str, list[float]] = {name: [] for name in chosen}
        failures: dict[str, Counter[int]] = {name: Counter() for name in chosen}
        for round_ in range(args.rounds):
            for name, server in servers.items():
                run(load(server.port, min(1.0, args.seconds), args.connections))  # warm up
                rate, latencies, statuses = run(load(server.port, args.seconds, args.connections))
                rates[name].append(rate)
                p50s[name].append(percentile(latencies, 0.5))
                p99s[name].append(percentile(latencies, 0.99))
                failures[name].update({s: n for s, n in statuses.items() if s != 200})
                print(f"round {round_ + 1}: {name}: {rate:,.0f}/s", file=sys.stderr)
    base = statistics.median(rates["no limiter"])
    print(
        f"\nFastAPI under uvicorn (1 worker, uvloop, httptools), {args.connections} keep-alive "
        f"connections, {args.seconds:g} s x {args.rounds} rounds (medians)"
        f"{', gc.freeze() after start' if args.gc_freeze else ''}; Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs\n"
    )
    print("| app | requests/s | p50 ms | p99 ms | of no limiter | not 200 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in chosen:
        rate = statistics.median(rates[name])
        bad = ", ".join(f"{n} x {s}" for s, n in sorted(failures[name].items())) or "0"
        print(
            f"| {name} | {rate:,.0f} | {statistics.median(p50s[name]) * 1000:.2f} | "
            f"{statistics.median(p99s[name]) * 1000:.2f} | {rate / base:.2f} | {bad} |"
        )


if __name__ == "__main__":
    main()
