"""Redis Sentinel (issue 15): ``redis+sentinel://`` URLs, and a primary killed under traffic
while a sentinel promotes its replica: no call past its deadline, the failure policy
answering meanwhile, decisions exact again after the failover."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio.sentinel import Sentinel

from ratelimit import ConfigurationError, RateLimit
from ratelimit.backends.redis.client import sentinel_client
from tests.redis_server import SentinelSet
from tests.traffic import through_a_failure

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
            failover = await through_a_failure(
                lambda n: rl.limit("user:100000/h", key="traffic", user=f"u{n % 50}").decide(),
                servers.primary.stop,  # SIGKILL, under traffic
            )
            print(
                f"sentinel failover: decisions answered by Redis again "
                f"{failover.resumed_after:.2f} s after the primary died; {failover.degraded} "
                f"degraded (fail-open) meanwhile; slowest call {failover.slowest * 1000:.0f} ms"
            )
            assert failover.resumed_after < RESUME_WITHIN
            # no call waits past its deadline (a margin for a loaded machine's scheduling)
            assert failover.slowest < timeout + 2.0
            # exact again on the new primary: a fresh limit admits exactly its count
            exact = rl.limit("3/h", key=f"after-{uuid.uuid4().hex[:6]}")
            assert [(await exact.decide()).allowed for _ in range(4)] == [True] * 3 + [False]
