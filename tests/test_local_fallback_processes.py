"""Issue 39 (1), done-when: with Redis killed under traffic from 4 processes,
``on_error="local"`` admits at most the processes' local shares, and decisions go back to
the store within a second of it answering again (a real redis-server, killed and
restarted)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as aioredis

from ratelimit import RateLimit
from ratelimit.pipeline.fallback import PROBE_EVERY
from tests.redis_server import RedisServer
from tests.workers import run_workers

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120), pytest.mark.long]

PROCESSES = 4
SHARE = 0.25
AFTER = 10
"""Decisions each process makes on the store once it is back."""
BACK_WITHIN = 1.0 + PROBE_EVERY
"""The issue's second, plus one probe period (a call may find the last probe just begun)."""


async def test_four_processes_decide_their_local_shares_while_redis_is_down(
    redis_url: str,
) -> None:
    namespace = f"local-{uuid.uuid4().hex[:8]}"
    control = aioredis.Redis.from_url(redis_url)  # the handshake's Redis, never killed
    answered_at = 0.0
    with RedisServer() as data:

        async def kill_then_restart() -> None:
            nonlocal answered_at
            deadline = time.monotonic() + 60
            while int(await control.get(f"{namespace}:local") or 0) < PROCESSES:
                assert time.monotonic() < deadline, "the workers made no local decisions"
                await asyncio.sleep(0.01)  # polling child processes, not waiting for a window
            await asyncio.to_thread(data.start)  # same port; returns once it answers PING
            answered_at = time.time()

        data.stop()  # killed before the go: every call of the outage meets a dead store
        outputs = await run_workers(
            control,
            namespace,
            "tests.local_fallback_worker",
            redis_url,
            namespace,
            data.url,
            str(SHARE),
            str(AFTER),
            count=PROCESSES,
            after_go=kill_then_restart,
        )
        rows = [out.decode().split() for out in outputs]
        local_admitted = [int(row[1]) for row in rows]
        back = [float(row[2]) - answered_at for row in rows]
        store_admitted = sum(int(row[3]) for row in rows)
        print(  # shown with -s: what the done-when asks to see
            f"local decisions {[int(r[0]) for r in rows]}, admitted {local_admitted} "
            f"(share {SHARE} of 100: at most {int(100 * SHARE)} each); back on the store "
            f"{[f'{b:.3f}' for b in back]} s after it answered; degraded after "
            f"{[int(r[4]) for r in rows]}"
        )
        assert all(int(row[0]) >= 200 for row in rows)
        assert sum(local_admitted) <= PROCESSES * int(100 * SHARE)
        assert all(0 < n <= int(100 * SHARE) for n in local_admitted)  # bounded, not closed
        assert all(b <= BACK_WITHIN for b in back), back
        assert store_admitted == PROCESSES * AFTER  # the store had counted nothing locally
        async with RateLimit.from_url(
            data.url, namespace, on_error="raise", timeout=5.0
        ) as rl:  # the store counted what it admitted after the return
            peek = await rl.limit("user:100/h", key="hit", user="victim").peek()
            assert peek.remaining == 100 - store_admitted - 1  # a peek counts itself in
    await control.aclose()
