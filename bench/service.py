"""RPCs per second of ``ratelimit serve`` (ratio's API over gRPC) beside the same decisions
made by the library in process, on the same Redis, at concurrency 1 and 64.

    python bench/service.py [--seconds 3] [--rounds 3]

Starts its own redis-server (or uses ``REDIS_URL``) and the service as a process
(``python -m ratelimit serve``, uvloop not used: the service runs on asyncio's own loop).
Each decision is one admitted call for one of 10 000 owners under ``1000/m`` per (owner,
resource). The client side runs here, on one gRPC channel (``grpc.aio``). Prints a Markdown
table: decisions/s, p50 and p99 latency, and the service as a share of in process.
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
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from ratelimit import RateLimit
from ratelimit.service.proto import ratio_pb2, ratio_pb2_grpc
from tests.redis_server import RedisServer
from tests.service_process import ServiceProcess

OWNERS = 10_000
RULE = "1000/m"
CONCURRENCY = (1, 64)

Decide = Callable[[str], Awaitable[bool]]


async def run(decide: Decide, seconds: float, concurrency: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**12))

    async def worker() -> None:
        while time.perf_counter() < deadline:
            owner = f"owner-{next(counter) % OWNERS}"
            started = time.perf_counter()
            if not await decide(owner):
                raise RuntimeError("a call was refused: the benchmark measures admitted calls")
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies) / (time.perf_counter() - started), latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(
    url: str, address: str, seconds: float, rounds: int
) -> dict[tuple[str, int], list[tuple[float, float, float]]]:
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    async with (
        grpc.aio.insecure_channel(address) as channel,
        RateLimit.from_url(url, namespace=f"bench-lib-{uuid.uuid4().hex[:6]}") as rl,
    ):
        stub = ratio_pb2_grpc.RateLimitServiceStub(channel)
        tree = RULE.replace("1000/m", "owner_resource:1000/m")

        async def over_grpc(owner: str) -> bool:
            answer = await stub.RateLimit(ratio_pb2.RateLimitRequest(owner=owner, resource="r"))
            return answer.code == ratio_pb2.RateLimitResponse.OK

        async def in_process(owner: str) -> bool:
            pair = f"{owner}\x1fr"
            return (await rl.limit(tree, key="ratio", owner_resource=pair).decide()).allowed

        contenders = {
            "service over gRPC (ratio's API)": over_grpc,
            "library in process": in_process,
        }
        for _ in range(rounds):
            for concurrency in CONCURRENCY:
                for name, decide in contenders.items():
                    await run(decide, min(0.5, seconds), concurrency)  # warm up
                    rate, latencies = await run(decide, seconds, concurrency)
                    results.setdefault((name, concurrency), []).append(
                        (rate, percentile(latencies, 0.5), percentile(latencies, 0.99))
                    )
                    print(f"{name} c={concurrency}: {rate:,.0f}/s", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with ExitStack() as stack:
        url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        env = {
            "RATELIMIT_STORAGE": url,
            "RATELIMIT_RULES": RULE,
            "RATELIMIT_METRICS": "none",
            "RATELIMIT_NAMESPACE": f"bench-svc-{uuid.uuid4().hex[:6]}",
        }
        service = stack.enter_context(ServiceProcess(env))
        results = asyncio.run(measure(url, service.address, args.seconds, args.rounds))
    print(
        f"\nratio's RateLimit over gRPC vs in process, {RULE} per (owner, resource) over "
        f"{OWNERS:,} owners, {args.seconds:g} s x {args.rounds} rounds (medians); Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs\n"
    )
    print("| path | concurrency | decisions/s | p50 ms | p99 ms | of in process |")
    print("|---|---:|---:|---:|---:|---:|")
    for concurrency in CONCURRENCY:
        base = statistics.median(r[0] for r in results[("library in process", concurrency)])
        for (name, c), rows in results.items():
            if c != concurrency:
                continue
            rate = statistics.median(r[0] for r in rows)
            p50 = statistics.median(r[1] for r in rows) * 1000
            p99 = statistics.median(r[2] for r in rows) * 1000
            print(f"| {name} | {c} | {rate:,.0f} | {p50:.2f} | {p99:.2f} | {rate / base:.2f} |")


if __name__ == "__main__":
    main()
