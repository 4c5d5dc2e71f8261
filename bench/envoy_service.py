"""Envoy's ``ShouldRateLimit`` per second on the service, one limit written three ways, in
one run on one Redis: the rules file (TOML, ``ratelimit serve``), envoyproxy/ratelimit's
YAML directory served as that service does (``ratelimit serve --envoy``: its fixed windows
on its keys), and the same directory on our sliding log (``RATELIMIT_ALGORITHM``).

    python bench/envoy_service.py [--seconds 3] [--rounds 3]

Starts its own redis-server (or uses ``REDIS_URL``) and the three services as processes,
each one worker on asyncio's loop, each its own keys. Every request is one descriptor,
``remote_address`` of one of 10 000 addresses, under 1 000 a minute per address (every
request admitted). One client process with 8 channels a service sends at concurrency 1 and
64; rounds interleave the services (their order turns each round). Prints a Markdown table:
requests/s, p50 and p99 latency, the ratio to the rules file, and the CPU each request
cost the service and Redis (from ``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from tests.redis_server import RedisServer
from tests.service_process import EnvoyProcess, ServiceProcess

ADDRESSES = 10_000
CONCURRENCY = (1, 64)
CHANNELS = 8
LOCAL_POOL = (("grpc.use_local_subchannel_pool", 1),)
TICK = os.sysconf("SC_CLK_TCK")
TOML = "rules file (TOML), sliding log"
YAML = "YAML directory, its fixed windows (--envoy)"
OURS = "YAML directory, our sliding log (--envoy)"
RULES = """\
[[limit]]
domain = "edge"
descriptor = ["remote_address"]
rule = "1000/m"
"""
CONFIG = """\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1000}
"""


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def measure(
    stubs: list[rls_pb2_grpc.RateLimitServiceAsyncStub], seconds: float, concurrency: int
) -> tuple[int, float, list[float]]:
    latencies: list[float] = []
    counter = iter(range(10**12))
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            n = next(counter)
            request = rls_pb2.RateLimitRequest(domain="edge")
            entry = request.descriptors.add().entries.add()
            entry.key, entry.value = "remote_address", f"10.0.{n % ADDRESSES // 256}.{n % 256}"
            started = time.perf_counter()
            answer = await stubs[n % len(stubs)].ShouldRateLimit(request)
            if answer.overall_code != rls_pb2.RateLimitResponse.OK:
                raise RuntimeError("a request was refused: the benchmark measures admitted ones")
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies), time.perf_counter() - started, latencies


Row = tuple[float, float, float, float, float]


async def run(
    addresses: dict[str, str], pids: dict[str, int], redis_pid: int | None, args: argparse.Namespace
) -> dict[tuple[str, int], list[Row]]:
    channels = {
        name: [grpc.aio.insecure_channel(address, options=LOCAL_POOL) for _ in range(CHANNELS)]
        for name, address in addresses.items()
    }
    stubs = {
        name: [rls_pb2_grpc.RateLimitServiceStub(c) for c in opened]
        for name, opened in channels.items()
    }
    names = list(addresses)
    results: dict[tuple[str, int], list[Row]] = {}
    for n in range(args.rounds):
        for concurrency in CONCURRENCY:
            for name in names[n % len(names) :] + names[: n % len(names)]:
                await measure(stubs[name], min(0.5, args.seconds), concurrency)  # warm up
                service_before = cpu_seconds(pids[name])
                redis_before = cpu_seconds(redis_pid) if redis_pid else 0.0
                calls, wall, latencies = await measure(stubs[name], args.seconds, concurrency)
                service_cpu = cpu_seconds(pids[name]) - service_before
                redis_cpu = (cpu_seconds(redis_pid) - redis_before) if redis_pid else 0.0
                latencies.sort()
                row = (
                    calls / wall,
                    latencies[len(latencies) // 2],
                    latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
                    service_cpu / calls,
                    redis_cpu / calls,
                )
                results.setdefault((name, concurrency), []).append(row)
                print(f"{name} c={concurrency}: {row[0]:,.0f}/s", file=sys.stderr)
    for opened in channels.values():
        for channel in opened:
            await channel.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with ExitStack() as stack:
        url = os.environ.get("REDIS_URL")
        redis_pid = None
        if not url:
            redis = stack.enter_context(RedisServer())
            url, redis_pid = redis.url, redis.pid
        host_port = url.removeprefix("redis://").split("/")[0]
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        (folder / "rules.toml").write_text(RULES)
        (folder / "ratelimit" / "config").mkdir(parents=True)
        (folder / "ratelimit" / "config" / "edge.yaml").write_text(CONFIG)
        toml = ServiceProcess(
            {
                "RATELIMIT_STORAGE": url,
                "RATELIMIT_RULES_FILE": str(folder / "rules.toml"),
                "RATELIMIT_METRICS": "none",
                "RATELIMIT_RESPONSE_HEADERS": "off",
                "RATELIMIT_NAMESPACE": f"bench-{uuid.uuid4().hex[:6]}",
            }
        )
        envoy = {
            "RUNTIME_ROOT": str(folder),
            "RUNTIME_SUBDIRECTORY": "ratelimit",
            "REDIS_SOCKET_TYPE": "tcp",
            "REDIS_URL": host_port,
        }
        yaml = EnvoyProcess({**envoy, "CACHE_KEY_PREFIX": f"bench-{uuid.uuid4().hex[:6]}:"})
        ours = EnvoyProcess(
            {
                **envoy,
                "CACHE_KEY_PREFIX": f"bench-{uuid.uuid4().hex[:6]}",
                "RATELIMIT_ALGORITHM": "sliding-log",
            }
        )
        services = {TOML: toml, YAML: yaml, OURS: ours}
        for service in services.values():
            stack.enter_context(service)
        addresses = {name: f"127.0.0.1:{s.port}" for name, s in services.items()}
        pids = {name: s.process.pid for name, s in services.items() if s.process}
        results = asyncio.run(run(addresses, pids, redis_pid, args))
    report(results, args)


def report(results: dict[tuple[str, int], list[Row]], args: argparse.Namespace) -> None:
    print(
        f"\nShouldRateLimit over gRPC, one service process each, one descriptor of "
        f"{ADDRESSES:,} addresses, {args.seconds:g} s x {args.rounds} rounds (medians); "
        f"one client process, {CHANNELS} channels a service; Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs shared by the client, the "
        "services and Redis\n"
    )
    print(
        "| service | concurrency | requests/s | p50 ms | p99 ms | of the rules file "
        "| service CPU µs/request | Redis CPU µs/request |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for concurrency in CONCURRENCY:
        base = statistics.median(r[0] for r in results[(TOML, concurrency)])
        for name in (TOML, YAML, OURS):
            rows = results[(name, concurrency)]
            rate = statistics.median(r[0] for r in rows)
            p50, p99 = (statistics.median(r[i] for r in rows) * 1000 for i in (1, 2))
            service, redis = (statistics.median(r[i] for r in rows) * 1e6 for i in (3, 4))
            print(
                f"| {name} | {concurrency} | {rate:,.0f} | {p50:.2f} | {p99:.2f} "
                f"| {rate / base:.2f} | {service:.0f} | {redis:.0f} |"
            )


if __name__ == "__main__":
    main()
