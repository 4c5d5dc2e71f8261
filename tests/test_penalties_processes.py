"""Penalties across OS processes on a real Redis (both engines) and PostgreSQL: four
processes each cause fewer refusals than the penalty's threshold, so a hold starts only
from their refusals together; then each process sees it at once (a limiter made anew
included, which knows nothing of it)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as aioredis

from ratelimit import RateLimit
from tests.workers import run_workers

pytestmark = [pytest.mark.redis, pytest.mark.long]

ENGINES = ["script", "commands", pytest.param("postgres", marks=pytest.mark.postgres)]

CALLS = 3  # per process: at most 3 refusals each, 8 needed


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_hold_started_together_is_seen_by_every_process(
    request: pytest.FixtureRequest, redis_url: str, engine: str
) -> None:
    store = request.getfixturevalue("postgres_url") if engine == "postgres" else redis_url
    client = aioredis.Redis.from_url(redis_url)
    namespace = f"penalty-{uuid.uuid4().hex[:8]}"

    async def when_all_done() -> None:
        deadline = time.monotonic() + 60
        while int(await client.get(f"{namespace}:done") or 0) < 4:
            assert time.monotonic() < deadline, "workers did not finish"
            await asyncio.sleep(0.01)  # polling child processes, not waiting for a window
        await client.rpush(f"{namespace}:again", *["go"] * 4)

    try:
        outputs = await run_workers(
            client,
            namespace,
            "tests.penalty_worker",
            redis_url,
            namespace,
            engine,
            str(CALLS),
            store,
            after_go=when_all_done,
        )
        rows = [[int(n) for n in out.split()] for out in outputs]
        admitted, refused, started, held = (sum(row[i] for row in rows) for i in range(4))
        assert admitted == 1  # ip:1/h across every process
        assert admitted + refused + started + held == 4 * CALLS
        assert refused >= 7  # the 8th refusal starts the hold, not before
        assert all(row[1] + row[2] < 8 for row in rows)  # no process crossed it alone
        assert all(row[4] >= 3590 for row in rows), rows  # a limiter made anew sees it
        assert all(row[5] >= 3590 for row in rows), rows  # and each process's own
        algorithm = "sliding-window" if engine == "postgres" else "sliding-log"
        rl = RateLimit.from_url(store, namespace=namespace, algorithm=algorithm)
        holds = await rl.penalties.list()
        assert [(h.key, h.selector, h.value) for h in holds] == [("login", "ip", "203.0.113.9")]
        assert await rl.penalties.lift("login", ip="203.0.113.9") == 1
        assert await rl.penalties.list() == []
        await rl.aclose()
    finally:
        await client.aclose()
