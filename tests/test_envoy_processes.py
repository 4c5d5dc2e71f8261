"""Four OS processes of ``ratelimit serve --envoy`` on one configuration directory and one
real Redis, as a deployment of envoyproxy/ratelimit's service runs: requests sent to all
four at once are counted exactly, on its keys, for a nested, a wildcard (its own counter
per value, and one shared by ``share_threshold``), a ``replaces`` and a ``quota_mode``
descriptor."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest
import redis.asyncio as aioredis

from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from tests.service_process import EnvoyProcess

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
RLS = rls_pb2.RateLimitResponse

CONFIG = """\
domain: rl
descriptors:
  - key: tenant
    descriptors:
      - key: model
        rate_limit: {unit: day, requests_per_unit: 40}
  - key: path
    value: "/api/*"
    rate_limit: {unit: day, requests_per_unit: 30}
  - key: path
    value: "/static/*"
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 30}
  - key: old
    rate_limit: {unit: day, requests_per_unit: 5, name: old}
  - key: new
    rate_limit: {unit: day, requests_per_unit: 25, replaces: [{name: old}]}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 20}
"""


@pytest.fixture(params=["its-windows", "sliding-log"])
def services(
    tmp_path: Path, redis_url: str, request: pytest.FixtureRequest
) -> Iterator[tuple[list[EnvoyProcess], str]]:
    """Its fixed windows on its keys, or our sliding log (``RATELIMIT_ALGORITHM``): the
    same totals admitted."""
    folder = tmp_path / "ratelimit" / "config"
    folder.mkdir(parents=True)
    (folder / "rl.yaml").write_text(CONFIG)
    where = urlsplit(redis_url)
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    env = {
        "RUNTIME_ROOT": str(tmp_path),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"{where.hostname}:{where.port}",
        "CACHE_KEY_PREFIX": prefix,
        "EXPIRATION_JITTER_MAX_SECONDS": "0",
    }
    if request.param != "its-windows":
        env["RATELIMIT_ALGORITHM"] = request.param
    started: list[EnvoyProcess] = []
    try:
        for _ in range(4):
            started.append(EnvoyProcess(env).start())
        yield started, prefix
    finally:
        for process in started:
            process.stop()


def asked(*descriptors: list[tuple[str, str]]) -> rls_pb2.RateLimitRequest:
    request = rls_pb2.RateLimitRequest(domain="rl")
    for entries in descriptors:
        descriptor = request.descriptors.add()
        for key, value in entries:
            descriptor.entries.add(key=key, value=value)
    return request


async def test_four_processes_count_exactly(
    services: tuple[list[EnvoyProcess], str], redis_client: aioredis.Redis
) -> None:
    processes, prefix = services
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p.port}") for p in processes]
    stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
    day = int(time.time()) // 86400 * 86400
    cases = {
        "nested": (asked([("tenant", "t"), ("model", "m")]), 100),
        "wildcard": (asked([("path", "/api/x")]), 70),
        "shared a": (asked([("path", "/static/a")]), 35),
        "shared b": (asked([("path", "/static/b")]), 35),
        "replaces": (asked([("old", "x")], [("new", "x")]), 60),
        "quota": (asked([("quota_a", "x")], [("quota_b", "x")]), 60),
    }
    calls = [(name, request) for name, (request, n) in cases.items() for _ in range(n)]

    async def one(i: int, name: str, request: rls_pb2.RateLimitRequest) -> tuple[str, bool]:
        answer = await stubs[i % 4].ShouldRateLimit(request, timeout=30)
        return name, answer.overall_code == RLS.OK

    answers = await asyncio.gather(*(one(i, n, r) for i, (n, r) in enumerate(calls)))
    for channel in channels:
        await channel.close()
    if int(time.time()) // 86400 * 86400 != day:
        pytest.skip("the day turned (UTC) while it ran: its windows split the counts")
    admitted = {name: sum(ok for n, ok in answers if n == name) for name in cases}
    # shared: the two values count on one counter of 30
    assert admitted.pop("shared a") + admitted.pop("shared b") == 30
    assert admitted == {"nested": 40, "wildcard": 30, "replaces": 25, "quota": 20}
    if any("RATELIMIT_ALGORITHM" in p.env for p in processes):
        return  # ours: admitted ones only, on our keys
    # every hit counted on its service's keys, refused ones too; "old" never counted
    keys = [
        f"{prefix}rl_tenant_t_model_m_{day}",
        f"{prefix}rl_path_/api/x_{day}",
        f"{prefix}rl_path_/static/*_{day}",
        f"{prefix}rl_new_x_{day}",
        f"{prefix}rl_old_x_{day}",
        f"{prefix}rl_quota_a_x_{day}",
        f"{prefix}rl_quota_b_x_{day}",
    ]
    values = [None if v is None else int(v) for v in await redis_client.mget(keys)]
    assert values == [100, 70, 70, 60, None, 60, 60]
    ttl = await redis_client.ttl(keys[0])
    assert 0 < ttl <= 86400
