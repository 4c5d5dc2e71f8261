"""RPCs per second of ``ratelimit serve`` (ratio's API over gRPC), with one worker and with
``--workers N``, beside the same decisions made by the library in process, on the same
Redis, at concurrency 1 and 64.

    python bench/service.py [--seconds 3] [--rounds 3] [--workers 2] [--clients 1]

Starts its own redis-server (or uses ``REDIS_URL``) and both services as processes
(``python -m ratelimit serve``, uvloop not used: the service runs on asyncio's own loop),
each under a namespace of its own. Each decision is one admitted call for one of 10 000
owners under ``1000/m`` per (owner, resource); every path cycles through the same owners.

The client side is ``--clients K`` OS processes (spawned once, each with its own event loop,
its own limiter for the in-process path and its own channels to each service: 8 channels a
service, each its own connection, so that the kernel spreads them over the workers), the
concurrency split between them (at concurrency 1, one process sends). One client process
on one core may be what limits N workers: K above 1 tells. Rounds interleave the paths
(their order turns each round). Prints a Markdown table: decisions/s, p50 and p99 latency,
the share of in process, and where the CPU went during each measurement (CPU seconds per
second, from ``/proc``: the client processes, the service's processes, redis-server).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from ratelimit import RateLimit
from ratelimit.service.proto import ratio_pb2, ratio_pb2_grpc
from tests.redis_server import RedisServer
from tests.service_process import ServiceProcess

OWNERS = 10_000
RULE = "1000/m"
CONCURRENCY = (1, 64)
CHANNELS = 8
"""Channels (connections) each client process opens to each service: all 8 on one of 2
workers, as the kernel hashes them, is one chance in 128 (the progress lines show each
service process's CPU, so a lopsided spread shows)."""
LOCAL_POOL = (("grpc.use_local_subchannel_pool", 1),)
"""Each channel its own connection: channels of one process to one address otherwise share."""
IN_PROCESS = "library in process"
TICK = os.sysconf("SC_CLK_TCK")

Decide = Callable[[str], Awaitable[bool]]
Barrier = Any  # multiprocessing's Barrier, shared by the clients and this process
Measured = tuple[int, float, list[float]]
"""One client process's calls, seconds, and each call's latency."""


async def run(decide: Decide, seconds: float, concurrency: int, first: int) -> Measured:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    counter = iter(range(first, 10**12))

    async def worker() -> None:
        while time.perf_counter() < deadline:
            owner = f"owner-{next(counter) % OWNERS}"
            started = time.perf_counter()
            if not await decide(owner):
                raise RuntimeError("a call was refused: the benchmark measures admitted calls")
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies), time.perf_counter() - started, latencies


def client(commands: Connection, go: Barrier, url: str, services: dict[str, str], n: int) -> None:
    """One client process: runs what it is told (path, concurrency, seconds) until ``None``,
    after a warm-up and then ``go`` (every client and the parent), and sends back what it
    measured."""
    asyncio.run(_client(commands, go, url, services, n))


async def _client(
    commands: Connection, go: Barrier, url: str, services: dict[str, str], n: int
) -> None:
    channels = {
        name: [grpc.aio.insecure_channel(address, options=LOCAL_POOL) for _ in range(CHANNELS)]
        for name, address in services.items()
    }
    namespace, count = commands.recv()
    async with RateLimit.from_url(url, namespace=namespace) as rl:
        tree = "owner_resource:" + RULE
        paths: dict[str, Decide] = {name: _over_grpc(opened) for name, opened in channels.items()}

        async def in_process(owner: str) -> bool:
            pair = f"{owner}\x1fr"
            return (await rl.limit(tree, key="ratio", owner_resource=pair).decide()).allowed

        paths[IN_PROCESS] = in_process
        first = n * OWNERS // count  # each process its own place in the same owners
        while (command := await asyncio.to_thread(commands.recv)) is not None:
            name, concurrency, seconds = command
            if concurrency:
                await run(paths[name], min(0.5, seconds), concurrency, first)  # warm up
            await asyncio.to_thread(go.wait, 120)
            measured = await run(paths[name], seconds, concurrency, first) if concurrency else None
            commands.send(measured or (0, seconds, []))
    for opened in channels.values():
        for channel in opened:
            await channel.close()


def _over_grpc(opened: list[grpc.aio.Channel]) -> Decide:
    stubs = [ratio_pb2_grpc.RateLimitServiceStub(channel) for channel in opened]
    turn = iter(range(10**12))

    async def over_grpc(owner: str) -> bool:
        stub = stubs[next(turn) % len(stubs)]
        answer = await stub.RateLimit(ratio_pb2.RateLimitRequest(owner=owner, resource="r"))
        return answer.code == ratio_pb2.RateLimitResponse.OK

    return over_grpc


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of ``pids`` so far (``/proc/<pid>/stat``)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICK


def service_pids(service: ServiceProcess) -> list[int]:
    """The service's process and its workers."""
    assert service.process is not None
    pid = service.process.pid
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(child) for child in (task / "children").read_text().split()]
    return [pid, *children]


class Clients:
    """``count`` client processes, told together what to measure."""

    def __init__(self, count: int, url: str, services: dict[str, str]) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.go = spawn.Barrier(count + 1)
        namespace = f"bench-lib-{uuid.uuid4().hex[:6]}"  # one for every client, as a service's
        self.pipes: list[Connection] = []
        self.processes = []
        for n in range(count):
            mine, theirs = spawn.Pipe()
            process = spawn.Process(target=client, args=(theirs, self.go, url, services, n))
            process.start()
            mine.send((namespace, count))
            self.pipes.append(mine)
            self.processes.append(process)

    def measure(
        self, name: str, concurrency: int, seconds: float, watched: dict[str, list[int]]
    ) -> tuple[float, list[float], dict[str, float]]:
        """Decisions per second of every client together, their latencies, and the CPU
        seconds per second of each of ``watched`` (and of the clients) meanwhile, and of
        each service process (``service <pid>``)."""
        count = len(self.pipes)
        shares = [concurrency // count + (n < concurrency % count) for n in range(count)]
        for pipe, share in zip(self.pipes, shares, strict=True):
            pipe.send((name, share, seconds))
        watched = {"clients": [p.pid for p in self.processes if p.pid], **watched}
        watched |= {f"service {pid}": [pid] for pid in watched.get("service", [])}
        self.go.wait(120)
        before = {what: cpu_seconds(pids) for what, pids in watched.items()}
        started = time.monotonic()
        results: list[Measured] = []
        for pipe in self.pipes:
            if not pipe.poll(seconds + 60):
                raise RuntimeError("a client process did not answer (see its traceback above)")
            results.append(pipe.recv())
        wall = time.monotonic() - started
        cpu = {what: (cpu_seconds(pids) - before[what]) / wall for what, pids in watched.items()}
        rate = sum(calls / seconds for calls, seconds, _ in results)
        return rate, [latency for _, _, each in results for latency in each], cpu

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


Row = tuple[float, float, float, dict[str, float]]


def measure(
    clients: Clients,
    paths: list[str],
    watched: dict[str, dict[str, list[int]]],
    seconds: float,
    rounds: int,
) -> dict[tuple[str, int], list[Row]]:
    results: dict[tuple[str, int], list[Row]] = {}
    for n in range(rounds):
        for concurrency in CONCURRENCY:
            turned = paths[n % len(paths) :] + paths[: n % len(paths)]
            for name in turned:
                rate, latencies, cpu = clients.measure(name, concurrency, seconds, watched[name])
                p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
                results.setdefault((name, concurrency), []).append((rate, p50, p99, cpu))
                each = " ".join(f"{w} {v:.2f}" for w, v in cpu.items() if w.startswith("service "))
                print(
                    f"{name} c={concurrency}: {rate:,.0f}/s, CPU {cpu_text(cpu)}", file=sys.stderr
                )
                print(f"  CPU of each service process: {each or '-'}", file=sys.stderr)
    return results


CPU_OF = ("clients", "service", "redis")


def cpu_text(cpu: dict[str, float]) -> str:
    """CPU seconds per second of the clients, the service and Redis: ``0.60 / 1.02 / 0.19``."""
    return " / ".join(f"{cpu[what]:.2f}" if what in cpu else "-" for what in CPU_OF)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="the workers of the extra row")
    parser.add_argument("--clients", type=int, default=1, help="client processes")
    args = parser.parse_args()
    with ExitStack() as stack:
        redis_pid: list[int] = []
        url = os.environ.get("REDIS_URL")
        if not url:
            redis = stack.enter_context(RedisServer())
            url, redis_pid = redis.url, [redis.pid] if redis.pid else []
        env = {"RATELIMIT_STORAGE": url, "RATELIMIT_RULES": RULE, "RATELIMIT_METRICS": "none"}
        one = "service, 1 worker (gRPC, ratio's API)"
        many = f"service, {args.workers} workers (gRPC, ratio's API)"
        services: dict[str, ServiceProcess] = {}
        for name, workers in ((one, 1), (many, args.workers)):
            namespace = f"bench-svc-{uuid.uuid4().hex[:6]}"
            more = {"RATELIMIT_WORKERS": str(workers), "RATELIMIT_NAMESPACE": namespace}
            services[name] = stack.enter_context(ServiceProcess({**env, **more}))
        clients = Clients(args.clients, url, {n: s.address for n, s in services.items()})
        stack.callback(clients.close)
        redis_only = {"redis": redis_pid} if redis_pid else {}
        watched = {n: {"service": service_pids(s), **redis_only} for n, s in services.items()}
        watched[IN_PROCESS] = redis_only
        results = measure(clients, [one, many, IN_PROCESS], watched, args.seconds, args.rounds)
    report(results, args, one, many)


def report(
    results: dict[tuple[str, int], list[Row]], args: argparse.Namespace, one: str, many: str
) -> None:
    print(
        f"\nratio's RateLimit over gRPC (1 and {args.workers} workers) vs in process, {RULE} "
        f"per (owner, resource) over {OWNERS:,} owners, {args.seconds:g} s x {args.rounds} "
        f"rounds (medians); client side: {args.clients} process(es), each its own event "
        f"loop and {CHANNELS} channels a service; Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs shared by the clients, the services and Redis\n"
    )
    print(
        "| path | concurrency | decisions/s | p50 ms | p99 ms | of in process "
        "| CPU cores: clients / service / redis |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for concurrency in CONCURRENCY:
        base = statistics.median(r[0] for r in results[(IN_PROCESS, concurrency)])
        for (name, c), rows in results.items():
            if c != concurrency:
                continue
            rate = statistics.median(r[0] for r in rows)
            p50 = statistics.median(r[1] for r in rows) * 1000
            p99 = statistics.median(r[2] for r in rows) * 1000
            cpu = {w: statistics.median(r[3][w] for r in rows) for w in CPU_OF if w in rows[0][3]}
            print(
                f"| {name} | {c} | {rate:,.0f} | {p50:.2f} | {p99:.2f} | {rate / base:.2f} "
                f"| {cpu_text(cpu)} |"
            )
    print()
    for concurrency in CONCURRENCY:
        rates = {
            name: statistics.median(r[0] for r in results[(name, concurrency)])
            for name in (one, many)
        }
        print(
            f"- concurrency {concurrency}: {args.workers} workers / 1 worker = "
            f"{rates[many] / rates[one]:.2f}x"
        )


if __name__ == "__main__":
    main()
