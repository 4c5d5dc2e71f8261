"""Redis Sentinel (issue 15): ``redis+sentinel://`` URLs, and a primary killed under traffic
while a sentinel promotes its replica: no call past its deadline, the failure policy
answering meanwhile, decisions exact again after the failover."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from redis.asyncio.sentinel import Sentinel

from ratelimit import ConfigurationError, RateLimit
from ratelimit.backends.redis.client import sentinel_client
from tests.redis_server import SentinelSet

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

RESUME_WITHIN = 20.0
"""Seconds after the primary's death by which decisions must be answered by Redis again
(the sentinel's down-after is 0.5 s; an election and the clients' rediscovery follow)."""


def test_sentinel_urls_are_checked_when_made() -> None:
    with pytest.raises(ConfigurationError, match="names the service"):
        sentinel_client("redis+sentinel://127.0.0.1:26379")
    with pytest.raises(ConfigurationError, match="sentinels are host:port"):
        sentinel_client("redis+sentinel://127.0.0.1:x/mymaster")
    with pytest.raises(ConfigurationError, match="names the service"):
        sentinel_client("redis+sentinel://127.0.0.1:26379/mymaster/zero")


async def test_a_failover_under_traffic() -> None:
    with SentinelSet() as servers:
        # a redis.asyncio.Sentinel master passed in works as a URL does
        sentinel = Sentinel([("127.0.0.1", servers.sentinel.port)])  # type: ignore[no-untyped-call]
        master = sentinel.master_for(servers.SERVICE)
        passed_in = RateLimit(master, f"passed-{uuid.uuid4().hex[:8]}")
        assert [(await passed_in.limit("2/h").decide()).allowed for _ in range(3)] == [
            True,
            True,
            False,
        ]
        await master.aclose()
        for connection in sentinel.sentinels:
            await connection.aclose()
        namespace = f"sentinel-{uuid.uuid4().hex[:8]}"
        timeout = 0.25
        async with RateLimit.from_url(servers.url, namespace, timeout=timeout) as rl:
            before = await rl.limit("5/h", key="exact").decide()
            assert before.allowed
            assert not before.degraded  # through the sentinel, to the primary
            latencies: list[float] = []
            degraded = 0
            killed_at = 0.0
            resumed_at = None
            deadline = time.monotonic() + 60
            n = 0
            while time.monotonic() < deadline:
                n += 1
                if n == 200:
                    servers.primary.stop()  # SIGKILL, under traffic
                    killed_at = time.monotonic()
                started = time.monotonic()
                traffic = rl.limit("user:100000/h", key="traffic", user=f"u{n % 50}")
                decision = await traffic.decide()
                latencies.append(time.monotonic() - started)
                if decision.degraded:
                    degraded += 1
                    resumed_at = None
                    await asyncio.sleep(0.01)  # a caller's pace, not a wait for a window
                elif killed_at and resumed_at is None:
                    resumed_at = time.monotonic()
                if resumed_at is not None and time.monotonic() - resumed_at > 1.0:
                    break  # answered by Redis again, for a second running
            assert killed_at
            assert resumed_at is not None, "decisions never came back from the new primary"
            print(
                f"sentinel failover: decisions answered by Redis again "
                f"{resumed_at - killed_at:.2f} s after the primary died; {degraded} degraded "
                f"(fail-open) meanwhile; slowest call {max(latencies) * 1000:.0f} ms"
            )
            assert resumed_at - killed_at < RESUME_WITHIN
            # no call waits past its deadline (a margin for a loaded machine's scheduling)
            assert max(latencies) < timeout + 2.0
            # exact again on the new primary: a fresh limit admits exactly its count
            exact = rl.limit("3/h", key=f"after-{uuid.uuid4().hex[:6]}")
            assert [(await exact.decide()).allowed for _ in range(4)] == [True] * 3 + [False]
