"""Requests per second of one Flask application under gunicorn (gthread): no limiter, ours
(``FlaskRateLimit``) and flask-limiter (``limits`` on Redis, moving and fixed window), on the
same route and the same Redis, as ratios to no limiter; then the decisions per second of the
synchronous API alone at 1, 8 and 32 threads against ``limits``' synchronous strategies.
Figures are reported, never asserted.

    python bench/wsgi.py [--seconds 5] [--rounds 3] [--connections 32] [--threads 8]
                         [--only NAME] [--skip-sync] [--sync-threads 1,8,32]

Starts its own redis-server (or uses ``REDIS_URL``) and one gunicorn process per contender
(``bench/flask_apps.py``: ``GET /ping``, 1000 a minute per ``X-API-Key``, rate-limit headers
on for every limiter as ours sends them, and flask-limiter once more without; one worker of
class gthread with ``--threads`` threads, 8 by default as in ``examples/flask_app.py``; no
access log). The load comes from this process, ``bench/web.py``'s: ``--connections``
keep-alive HTTP/1.1 connections on a small raw-socket client, spreading requests over 1000
keys so that nothing is refused (a contender that refuses or fails any request is reported).
With ``--rounds`` above one the contenders take turns, and each figure is the median of its
rounds. Prints a Markdown table, with the CPU time the gunicorn processes and redis-server
spent per request (from ``/proc``: on these shared cores the steadiest figure, and what a
GIL-bound worker's requests/s follow), then ``bench/sync_api.py``'s table on the same Redis
(``--seconds`` per row, the same rounds) unless ``--skip-sync``.
``--gc-freeze`` has each application call ``gc.freeze()`` once built.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sync_api
from web import load, percentile

from tests.gunicorn_server import GunicornServer
from tests.redis_server import RedisServer

CONTENDERS = {
    "no limiter": "none",
    "ratelimit: FlaskRateLimit route (sliding log)": "ratelimit",
    "ratelimit: @limits.limit view": "ratelimit-view",
    "ratelimit: FlaskRateLimit route, fixed window": "ratelimit-fixed",
    "flask-limiter (moving window)": "flask-limiter-moving",
    "flask-limiter (fixed window)": "flask-limiter-fixed",
    "flask-limiter (moving window, headers off)": "flask-limiter-moving-bare",
}
PEER = "flask-limiter (moving window)"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of ``pids`` so far (``/proc/<pid>/stat``, as bench/service.py
    reads it); a process gone since counts nothing."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICK


def gunicorn_pids(master: int) -> list[int]:
    """The gunicorn master and its workers."""
    children = []
    for task in Path(f"/proc/{master}/task").iterdir():
        children += [int(child) for child in (task / "children").read_text().split()]
    return [master, *children]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=8, help="gunicorn's threads (gthread)")
    parser.add_argument("--only", help="measure only contenders whose name contains this")
    parser.add_argument("--skip-sync", action="store_true", help="no table of the sync API")
    parser.add_argument("--sync-threads", default="1,8,32", help="the sync API's thread counts")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() in each app once it is built"
    )
    args = parser.parse_args()
    chosen = {
        name: app
        for name, app in CONTENDERS.items()
        if args.only is None or args.only in name or app == "none"
    }
    counts = [int(n) for n in args.sync_threads.split(",")]
    run = uvloop.run  # the bench extra has it
    with ExitStack() as stack:
        redis = None if os.environ.get("REDIS_URL") else stack.enter_context(RedisServer())
        url = redis.url if redis is not None else os.environ["REDIS_URL"]
        redis_pids = [] if redis is None or redis.pid is None else [redis.pid]
        rates: dict[str, list[float]] = {name: [] for name in chosen}
        p50s: dict[str, list[float]] = {name: [] for name in chosen}
        p99s: dict[str, list[float]] = {name: [] for name in chosen}
        failures: dict[str, Counter[int]] = {name: Counter() for name in chosen}
        server_cpu: dict[str, list[float]] = {name: [] for name in chosen}
        redis_cpu: dict[str, list[float]] = {name: [] for name in chosen}
        with ExitStack() as servers_stack:
            servers = {
                name: servers_stack.enter_context(
                    GunicornServer(
                        "bench.flask_apps:app",
                        {"BENCH_APP": app, "BENCH_REDIS": url}
                        | ({"BENCH_GC_FREEZE": "1"} if args.gc_freeze else {}),
                        threads=args.threads,
                    )
                )
                for name, app in chosen.items()
            }
            for round_ in range(args.rounds):
                for name, server in servers.items():
                    run(load(server.port, min(1.0, args.seconds), args.connections))  # warm up
                    assert server.process is not None
                    pids = gunicorn_pids(server.process.pid)
                    before = cpu_seconds(pids), cpu_seconds(redis_pids)
                    rate, latencies, statuses = run(
                        load(server.port, args.seconds, args.connections)
                    )
                    done = max(len(latencies), 1)
                    server_cpu[name].append((cpu_seconds(pids) - before[0]) / done)
                    redis_cpu[name].append((cpu_seconds(redis_pids) - before[1]) / done)
                    rates[name].append(rate)
                    p50s[name].append(percentile(latencies, 0.5))
                    p99s[name].append(percentile(latencies, 0.99))
                    failures[name].update({s: n for s, n in statuses.items() if s != 200})
                    print(f"round {round_ + 1}: {name}: {rate:,.0f}/s", file=sys.stderr)
        base = statistics.median(rates["no limiter"])
        peer = statistics.median(rates[PEER]) if PEER in rates else None
        print(
            f"\nFlask under gunicorn (1 worker, gthread, {args.threads} threads), "
            f"{args.connections} keep-alive connections, {args.seconds:g} s x {args.rounds} "
            f"rounds (medians){', gc.freeze() after start' if args.gc_freeze else ''}; Python "
            f"{platform.python_version()}, {os.cpu_count()} CPUs\n"
        )
        columns = ["app", "requests/s", "p50 ms", "p99 ms", "of no limiter"]
        columns += [f"of {PEER}"] if peer else []
        columns += ["gunicorn CPU µs/request"] + (["redis CPU µs/request"] if redis_pids else [])
        print("| " + " | ".join([*columns, "not 200"]) + " |")
        print("|---|" + "---:|" * len(columns))
        for name in chosen:
            rate = statistics.median(rates[name])
            cells = [
                name,
                f"{rate:,.0f}",
                f"{statistics.median(p50s[name]) * 1000:.2f}",
                f"{statistics.median(p99s[name]) * 1000:.2f}",
                f"{rate / base:.2f}",
            ]
            cells += [f"{rate / peer:.2f}"] if peer else []
            cells.append(f"{statistics.median(server_cpu[name]) * 1e6:,.0f}")
            cells += [f"{statistics.median(redis_cpu[name]) * 1e6:,.0f}"] if redis_pids else []
            bad = ", ".join(f"{n} x {s}" for s, n in sorted(failures[name].items())) or "0"
            print("| " + " | ".join([*cells, bad]) + " |")
        if args.skip_sync:
            return
        print(
            f"\nThe synchronous API alone (bench/sync_api.py), {args.seconds:g} s per row, median "
            f"of {args.rounds}; user:{sync_api.LIMIT}/m over {sync_api.USERS} users, the same "
            "Redis\n"
        )
        sync_api.print_table(sync_api.measure(url, args.seconds, args.rounds, counts), counts)


if __name__ == "__main__":
    main()
