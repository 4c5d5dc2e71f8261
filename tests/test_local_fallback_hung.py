"""``on_error="local"`` against a Redis that hangs (SIGSTOP: it keeps its connections and
answers nothing) rather than refuses: the first call waits out the limiter's ``timeout``
and the rest are decided locally at once, within the share, slots included; once the
server runs again the probe finds it and decisions go back to it. The probes are paced on
an injected clock; nothing sleeps."""

from __future__ import annotations

import asyncio
import time

import pytest

from ratelimit import RateLimit
from ratelimit.front.concurrency import ConcurrencyLimitExceeded
from ratelimit.pipeline import fallback
from ratelimit.pipeline.fallback import PROBE_EVERY
from tests.conftest import FakeClock
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

TIMEOUT = 2.0
"""The limiter's timeout: generous, so that a healthy decision under load never misses it."""


async def probes_done(rl: RateLimit) -> None:
    """Wait for the probe under way (a task of the limiter's), if any."""
    await asyncio.gather(*list(rl._decider._unfinished), return_exceptions=True)


async def test_a_hung_redis_is_decided_locally_and_left_when_it_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(fallback, "monotonic", clock)  # the probes paced on it too
    with RedisServer() as server:
        rl = RateLimit.from_url(
            server.url, "hung", on_error="local", local_share=0.5, timeout=TIMEOUT, clock=clock
        )
        limit = rl.limit("user:10/h", key="api", user="ann")
        slots = rl.concurrency("4", key="jobs")
        assert not (await limit.decide()).degraded  # healthy: one counted at the store
        server.pause()
        try:
            started = time.monotonic()
            decisions = [await limit.decide() for _ in range(8)]
            async with slots as first, slots as second:  # 4 * 0.5 locally
                with pytest.raises(ConcurrencyLimitExceeded):
                    async with slots:
                        pass
            waited = time.monotonic() - started
        finally:
            server.resume()
        assert [d.allowed for d in decisions] == [True] * 5 + [False] * 3  # 10 * 0.5
        assert all(d.degraded for d in decisions)
        assert first.degraded
        assert second.degraded
        assert waited < 4 * TIMEOUT  # one call waited for the timeout, not each (11 * 2 s)
        for _ in range(3):  # the probe under way when it ran again answers, or a later one
            await probes_done(rl)
            if not rl.storage_failing:
                break
            clock.advance(PROBE_EVERY)
            await limit.decide()
        assert not rl.storage_failing
        back = await limit.decide()
        assert not back.degraded
        assert back.remaining in (7, 8)  # the call that timed out may have been counted
        async with slots as taken:
            assert not taken.degraded
        await rl.aclose()
