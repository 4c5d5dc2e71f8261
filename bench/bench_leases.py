"""Leases on one hot limit, four OS processes on one Redis: decisions/s, store calls and client
CPU per decision, and calls admitted past the limit, side by side in one run.

    python bench/bench_leases.py [--seconds 12] [--processes 4] [--tasks 32]

Starts its own redis-server (or uses ``REDIS_URL``). Rows:

- **hot, below the limit**: ``apikey:100000/m`` (sliding log), as the decorator path runs
  it, 96 000 calls in all (every one admitted: a refusal would be the denial cache's, not
  the store's): per call (batched, as without leases) and with ``lease=0.05``;
  ``memory://`` in each process for the client CPU a decision costs with no store at all.
- **saturated**: ``apikey:1000/2s`` (fixed windows, so that a window is a window for every
  row) hammered for several windows: per call, ``lease=0.05`` and ``sync_rate=0.5`` (Kong's
  local counters); each process records when it asked and when it was admitted, and the
  bench counts, per window, the calls surely admitted in it, past the limit and at least.

Store calls are Redis's own count (``INFO commandstats``: ``EVALSHA`` and ``EVAL`` calls), so
they include the give-backs. Client CPU is the worker processes' own (``process_time``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from tests.lease_worker import per_window
from tests.redis_server import RedisServer

HOT = "apikey:100000/m"
SATURATED, SPAN, COUNT = "apikey:1000/2s", 2.0, 1000


async def _worker(
    url: str, namespace: str, rule: str, algorithm: str, seconds: float, tasks: int, mode: str
) -> dict[str, object]:
    from ratelimit import RateLimit, RateLimitExceeded

    settings: dict[str, object] = {"algorithm": algorithm}
    if mode != "memory":
        settings["timeout"] = None  # counts admissions: no decision is answered by on_error
    if mode == "lease":
        settings["lease"] = 0.05
    elif mode == "sync_rate":
        settings["sync_rate"] = 0.5
    store = "memory://" if mode == "memory" else url
    rl = RateLimit.from_url(store, namespace, **settings)  # type: ignore[arg-type]

    @rl.limit(rule, key="hot")
    async def call(apikey: str) -> None:
        return None

    control = redis.Redis.from_url(url)
    control.incr(f"{namespace}:ready")
    control.blpop([f"{namespace}:go"], timeout=60)
    admitted: list[tuple[float, float]] = []
    calls = 0
    cpu = time.process_time()
    started = time.perf_counter()
    ends = time.monotonic() + seconds

    async def one() -> None:
        nonlocal calls
        made = 0
        while (time.monotonic() < ends) if seconds > 0 else (made < -seconds):
            made += 1
            before = time.time()
            try:
                await call("k")
            except RateLimitExceeded:
                calls += 1
                await asyncio.sleep(0)
                continue
            calls += 1
            admitted.append((before, time.time()))

    await asyncio.gather(*(one() for _ in range(tasks)))
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    await rl.aclose()
    control.close()
    return {"admitted": admitted, "calls": calls, "cpu": cpu, "elapsed": elapsed}


def _server_cpu(client: redis.Redis) -> float:
    """Seconds of CPU the Redis server has used (``INFO cpu``)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def _store_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    names = ("evalsha", "eval")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in names)


def run(
    url: str, rule: str, algorithm: str, mode: str, seconds: float, processes: int, tasks: int
) -> dict[str, float]:
    """One row: ``processes`` workers of ``tasks`` coroutines for ``seconds`` (below 0:
    ``-seconds`` calls each)."""
    client = redis.Redis.from_url(url)
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    before = _store_calls(client)
    server_before = _server_cpu(client)
    args = [url, namespace, rule, algorithm, str(seconds), str(tasks), mode]
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", *args], stdout=subprocess.PIPE, text=True
        )
        for _ in range(processes)
    ]
    while int(client.get(f"{namespace}:ready") or 0) < processes:
        time.sleep(0.01)  # polling child processes
    client.rpush(f"{namespace}:go", *["go"] * processes)
    results = [json.loads(w.communicate()[0]) for w in workers]
    calls = sum(r["calls"] for r in results)
    admitted = [tuple(pair) for r in results for pair in r["admitted"]]
    elapsed = max(r["elapsed"] for r in results)
    surely, anywhere = per_window(admitted, SPAN)
    whole = sorted(anywhere)[1:-1]
    return {
        "decisions/s": calls / elapsed,
        "store calls/decision": (_store_calls(client) - before) / max(calls, 1),
        "Redis CPU us/decision": 1e6 * (_server_cpu(client) - server_before) / max(calls, 1),
        "client CPU us/decision": 1e6 * sum(r["cpu"] for r in results) / max(calls, 1),
        "most past the limit in a window": max([surely[w] - COUNT for w in whole] or [0]),
        "fewest in a whole window": min([anywhere[w] for w in whole] or [0]),
        "admitted": len(admitted),
        "calls": calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=12.0, help="of the saturated rows")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=32)
    options = parser.parse_args()
    each = 96_000 // (options.processes * options.tasks)  # below the hot limit in all
    server = None
    url = os.environ.get("REDIS_URL")
    if url is None:
        server = RedisServer().start()
        url = server.url
    try:
        hot = {
            mode: run(url, HOT, "sliding-log", mode, -each, options.processes, options.tasks)
            for mode in ("per call", "lease", "memory")
        }
        saturated_seconds = max(options.seconds, SPAN * 3)
        saturated = {
            mode: run(
                url, SATURATED, "fixed-window", mode, saturated_seconds, options.processes,
                options.tasks,
            )
            for mode in ("per call", "lease", "sync_rate")
        }  # fmt: skip
    finally:
        if server is not None:
            server.stop()
    print(f"\n{options.processes} processes x {options.tasks} coroutines, one hot key\n")
    print(f"**{HOT}, every call admitted** (sliding log)\n")
    print(
        "| | decisions/s | x per call | store calls/decision | client CPU µs/decision "
        "| Redis CPU µs/decision | decisions/s one Redis core sustains |"
    )
    print("|---|---|---|---|---|---|---|")
    base = hot["per call"]["decisions/s"]
    for mode, row in hot.items():
        assert row["admitted"] == row["calls"], f"{mode}: a call was refused below the limit"
        names = {"per call": "per call (batched)", "lease": "lease=0.05", "memory": "memory://"}
        name = names[mode]
        store = "—" if mode == "memory" else f"{row['store calls/decision']:.3f}"
        used = row["Redis CPU us/decision"]
        core = "—" if mode == "memory" else f"{1e6 / max(used, 1e-3):,.0f}"
        served = "—" if mode == "memory" else f"{used:.2f}"
        print(
            f"| {name} | {row['decisions/s']:,.0f} | {row['decisions/s'] / base:.2f} | {store} "
            f"| {row['client CPU us/decision']:.1f} | {served} | {core} |"
        )
    print(f"\n**{SATURATED}, hammered** (fixed windows, {saturated_seconds:g} s)\n")
    print("| | decisions/s | most admitted past the limit in a window | fewest in a whole window |")
    print("|---|---|---|---|")
    for mode, row in saturated.items():
        name = {"per call": "per call", "lease": "lease=0.05", "sync_rate": "sync_rate=0.5"}[mode]
        past = max(0, int(row["most past the limit in a window"]))
        print(
            f"| {name} | {row['decisions/s']:,.0f} | {past} "
            f"| {int(row['fewest in a whole window'])} |"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        url, namespace, rule, algorithm, seconds, tasks, mode = sys.argv[2:9]
        mode = {"per call": "per call"}.get(mode, mode)
        result = asyncio.run(
            _worker(url, namespace, rule, algorithm, float(seconds), int(tasks), mode)
        )
        print(json.dumps(result))
    else:
        main()
