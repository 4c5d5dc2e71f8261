"""What ``Route(delay=)`` costs: per request when configured but never used, and what a
spike against it gives.

1. Requests through ``RateLimitMiddleware`` in process (raw ASGI calls to a minimal
   application, no server, no client library), over 1 000 client addresses, every one
   admitted: a route without ``delay=`` against the same route with ``delay=2.0`` that
   nothing ever waits on. Requests per second and CPU microseconds per request
   (``time.process_time``), alternating rounds, medians.
2. A spike: ``n`` requests at once from one address on ``ip:5/s`` with ``delay=2.0``:
   how many were admitted at once, admitted after waiting, refused, and the longest wait.

On ``memory://``, and on Redis too with ``--redis URL``. ``--plain``: only the route
without ``delay=`` (runs on the code before the feature too, for a side by side).

    python3 bench/http_delay_costs.py [--requests 3000] [--rounds 5] [--spike 30]
                                      [--redis URL] [--plain]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

from ratelimit import RateLimit
from ratelimit.asgi import RateLimitMiddleware, Route

Message = MutableMapping[str, Any]


async def app(scope: Message, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def scope_of(peer: str) -> Message:
    return {
        "type": "http",
        "method": "GET",
        "path": "/api/items",
        "raw_path": b"/api/items",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"bench")],
        "client": (peer, 4000),
        "server": ("bench", 80),
    }


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def request(middleware: RateLimitMiddleware, peer: str) -> tuple[int, float]:
    """One request: its status and how long it took (seconds)."""
    status = 0

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    started = time.perf_counter()
    await middleware(scope_of(peer), receive, send)
    return status, time.perf_counter() - started


def middleware(rl: RateLimit, rules: str, delay: float) -> RateLimitMiddleware:
    given: dict[str, Any] = {"delay": delay} if delay else {}  # --plain: code before delay=
    return RateLimitMiddleware(app, rl, [Route("/api/{path:path}", rules, **given)])


async def unused(
    storage: str, requests: int, rounds: int, plain: bool
) -> dict[str, tuple[float, float]]:
    """Requests/s and CPU µs per request, without and with an unused delay."""
    peers = [f"10.0.{i // 250}.{i % 250}" for i in range(1000)]
    kinds = [("no delay", 0.0)] + ([] if plain else [("delay=2.0, unused", 2.0)])
    results: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in kinds}
    async with RateLimit.from_url(storage, namespace=f"bench-{uuid.uuid4().hex[:8]}") as rl:
        for _ in range(rounds):
            for name, delay in kinds:
                limited = middleware(rl, "ip:100000/h", delay)
                wall, cpu = time.perf_counter(), time.process_time()
                for n in range(requests):
                    status, _ = await request(limited, peers[n % len(peers)])
                    assert status == 200
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                results[name].append((requests / wall, cpu / requests * 1e6))
    return {
        name: (statistics.median(r for r, _ in rows), statistics.median(c for _, c in rows))
        for name, rows in results.items()
    }


async def spike(storage: str, n: int) -> tuple[int, int, int, float]:
    """Admitted at once, admitted after waiting, refused, the longest wait (s)."""
    async with RateLimit.from_url(storage, namespace=f"bench-{uuid.uuid4().hex[:8]}") as rl:
        limited = middleware(rl, "ip:5/s", 2.0)
        answers = await asyncio.gather(*(request(limited, "203.0.113.7") for _ in range(n)))
    at_once = sum(1 for status, took in answers if status == 200 and took < 0.5)
    waited = [took for status, took in answers if status == 200 and took >= 0.5]
    refused = sum(1 for status, _ in answers if status == 429)
    return at_once, len(waited), refused, max(waited, default=0.0)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--spike", type=int, default=30)
    parser.add_argument("--redis", default=None, help="also on this Redis")
    parser.add_argument("--plain", action="store_true", help="only routes without delay=")
    options = parser.parse_args()
    for storage in ["memory://", *([options.redis] if options.redis else [])]:
        store = storage.split("://")[0]
        figures = await unused(storage, options.requests, options.rounds, options.plain)
        for name, (rate, cpu) in figures.items():
            print(f"{store:7} {name:18} {rate:9.0f} requests/s  {cpu:6.1f} µs CPU/request")
        if options.plain:
            continue
        at_once, waited, refused, longest = await spike(storage, options.spike)
        print(
            f"{store:7} spike of {options.spike} on ip:5/s, delay=2.0: {at_once} admitted at "
            f"once, {waited} after waiting (longest {longest:.2f} s), {refused} refused"
        )


if __name__ == "__main__":
    asyncio.run(main())
