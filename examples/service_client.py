"""A Python client of each API of ``ratelimit serve``: ratio's RateLimit(owner, resource) and
Envoy's RLS v3 ShouldRateLimit.

    RATELIMIT_RULES=3/m RATELIMIT_RULES_FILE=examples/service_rules.toml ratelimit serve &
    python examples/service_client.py 127.0.0.1:50051

Without an address it starts the service itself on a free port (memory://, or Redis with
REDIS_URL set), asks it, prints what its Prometheus endpoint counted, and stops it.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import urllib.request
from pathlib import Path

import grpc

from ratelimit.service.proto import ratio_pb2, ratio_pb2_grpc
from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc

HERE = Path(__file__).resolve().parent
RLS = rls_pb2.RateLimitResponse


async def ask(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        ratio = ratio_pb2_grpc.RateLimitServiceStub(channel)
        for n in range(1, 5):
            answer = await ratio.RateLimit(
                ratio_pb2.RateLimitRequest(owner="ann", resource="search")
            )
            code = ratio_pb2.RateLimitResponse.Code.Name(answer.code)
            print(f"ratio RateLimit(ann, search) #{n}: {code}, {answer.remaining} left, "
                  f"retry after {answer.retry_after:.0f} s")  # fmt: skip

        envoy = rls_pb2_grpc.RateLimitServiceStub(channel)
        request = rls_pb2.RateLimitRequest(domain="edge")
        request.descriptors.add().entries.add(key="remote_address", value="203.0.113.7")
        login = request.descriptors.add()
        login.entries.add(key="path", value="/login")
        login.entries.add(key="remote_address", value="203.0.113.7")
        for n in range(1, 4):
            reply = await envoy.ShouldRateLimit(request)
            statuses = ", ".join(
                f"{RLS.Code.Name(s.code)} ({s.limit_remaining} left of "
                f"{s.current_limit.requests_per_unit}, reset in {s.duration_until_reset.seconds} s)"
                for s in reply.statuses
            )
            print(f"envoy ShouldRateLimit #{n}: {RLS.Code.Name(reply.overall_code)}: {statuses}")
            for header in reply.response_headers_to_add:  # Envoy adds these to its response
                print(f"    {header.key}: {header.value}")


def counted(metrics_url: str) -> None:
    """What the service's /metrics says it decided."""
    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith("ratelimit_decisions_total"):
            print(line)


def main() -> None:
    if len(sys.argv) > 1:
        asyncio.run(ask(sys.argv[1]))
        return
    sys.path.insert(0, str(HERE.parent))
    from tests.service_process import ServiceProcess

    env = {
        "RATELIMIT_RULES": "3/m",
        "RATELIMIT_RULES_FILE": str(HERE / "service_rules.toml"),
        "RATELIMIT_STORAGE": os.environ.get("REDIS_URL", "memory://"),
        "RATELIMIT_NAMESPACE": f"service-example-{os.getpid()}",
        "RATELIMIT_METRICS": "prometheus",  # ServiceProcess serves it on a free port
    }
    with ServiceProcess(env) as service:
        asyncio.run(ask(service.address))
        found = re.search(r"metrics on (http://\S+/metrics)", service.output)
        if found:
            counted(found.group(1))


if __name__ == "__main__":
    main()
