"""A refusal's message names its cause: the storage failing under ``on_error="deny"`` on
any store or engine, or (only on the command engine, ``use_scripts=False``) its lock held
past ``lock_timeout``."""

from __future__ import annotations

import fakeredis
import pytest
import redis.asyncio as aioredis

from ratelimit import RateLimit, RateLimitExceeded
from tests.conftest import FailingBackend

pytestmark = pytest.mark.timeout(30)

STORAGE_FAILED = (
    "call refused for key 'k': the rate-limit storage failed and on_error='deny' refuses "
    "calls until it answers; retry after "
)


async def refusal(rl: RateLimit) -> str:
    with pytest.raises(RateLimitExceeded) as refused:
        async with rl.limit("10/s", key="k"):
            raise AssertionError("the block ran")
    await rl.aclose()
    return str(refused.value)


async def test_a_failing_store_under_deny_says_nothing_of_a_lock() -> None:
    message = await refusal(RateLimit(FailingBackend(), on_error="deny"))
    assert message.startswith(STORAGE_FAILED)
    assert "lock" not in message


@pytest.mark.parametrize("use_scripts", [True, False], ids=["script", "commands"])
async def test_redis_down_under_deny_says_the_storage_failed_on_either_engine(
    use_scripts: bool,
) -> None:
    nothing_there = aioredis.Redis(host="127.0.0.1", port=1)  # nothing listens
    rl = RateLimit(nothing_there, on_error="deny", use_scripts=use_scripts, timeout=0.5)
    message = await refusal(rl)
    assert message.startswith(STORAGE_FAILED)
    assert "lock" not in message
    await nothing_there.aclose()


@pytest.mark.parametrize("on_error", ["allow", "deny"])
async def test_the_command_engines_lock_held_is_named_as_such(on_error: str) -> None:
    client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    await client.set("rl:{ns:k}:lock", "someone else", px=60_000)
    rl = RateLimit(client, "ns", use_scripts=False, lock_timeout=0.05, on_error=on_error)
    message = await refusal(rl)
    assert message.startswith(
        "call refused for key 'k': the command engine's lock stayed held past lock_timeout, "
        "which refuses under any on_error (use_scripts=False: contention, not an outage); "
        "retry after "
    )
    assert "storage failed" not in message  # the storage answers: contention, no outage
    await client.aclose()
