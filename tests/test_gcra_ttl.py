"""GCRA keys on Redis live as long as their bucket takes to fill, decided alone or in a
batch script: a batch hands its calls the server's instant, which is not an injected clock
(that one keeps keys an hour at least)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from ratelimit import RateLimit
from ratelimit.core.plan import compile_tree
from ratelimit.rules.tree import to_tree

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


async def test_gcra_keys_decided_in_a_batch_expire_when_their_bucket_is_full(
    redis_client: aioredis.Redis, namespace: str
) -> None:
    rl = RateLimit(redis_client, namespace, algorithm="gcra")
    limit = compile_tree(to_tree("user:10/m"))  # a full bucket 6 s after one call
    try:
        assert (await rl.decide(limit, "ttl", ("alone",))).allowed
        decisions = await asyncio.gather(*(rl.decide(limit, "ttl", (f"u{n}",)) for n in range(50)))
        assert all(d.allowed for d in decisions)
        batched = max(rl.storage.calls_per_script)  # type: ignore[attr-defined]
        assert batched > 1, "the calls went alone: nothing batched to look at"
        keys = [k async for k in redis_client.scan_iter(match=f"*{namespace}*")]
        ttls = [await redis_client.pttl(k) for k in keys]
        assert len(ttls) >= 51
        # keys that outlive the test's own slowness (a loaded machine took over 100 ms for
        # these 51 calls), and far short of the hour an injected clock keeps them
        assert 0 < max(ttls) <= 60_000, sorted(ttls)[-3:]
    finally:
        await rl.aclose()
