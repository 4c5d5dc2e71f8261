"""``on_error="local"``'s concurrency slots, as callers see their refusals: a take refused
because this process's local share of the slots is full is a refusal of the limit (429 at
the HTTP edge, a message naming the local share), not the storage's failure under
``on_error="deny"`` (503)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from ratelimit import RateLimit
from ratelimit.asgi import RateLimitMiddleware, SlotRoute
from ratelimit.concurrency import ConcurrencyLimitExceeded
from tests.conftest import FakeClock
from tests.test_local_fallback import Flaky

pytestmark = pytest.mark.timeout(30)


async def test_a_full_local_share_of_slots_says_so() -> None:
    store = Flaky(FakeClock())
    rl = RateLimit(store, on_error="local", local_share=0.5)
    slots = rl.concurrency("4", key="jobs")
    store.down = True
    async with slots, slots:  # 4 * 0.5 taken locally
        with pytest.raises(ConcurrencyLimitExceeded) as raised:
            async with slots:
                pass
    message = str(raised.value)
    assert raised.value.decision.degraded
    assert "local share" in message
    assert "on_error='local'" in message
    assert "on_error='deny'" not in message
    await rl.aclose()


async def test_a_slot_route_answers_a_full_local_share_429() -> None:
    store = Flaky(FakeClock())
    rl = RateLimit(store, on_error="local", local_share=0.5)
    release, entered = asyncio.Event(), asyncio.Queue[str]()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        entered.put_nowait(scope["path"])
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limited = RateLimitMiddleware(app, rl, [SlotRoute("/r/*", "4")])
    transport = httpx.ASGITransport(app=limited)
    store.down = True
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        running = [asyncio.create_task(client.get("/r/a")) for _ in range(2)]
        for _ in running:
            await entered.get()
        refused = await client.get("/r/b")
        release.set()
        statuses = [r.status_code for r in await asyncio.gather(*running)]
    assert statuses == [200, 200]
    assert refused.status_code == 429  # the local share is full: not "the storage failed"
    assert refused.json()["status"] == 429
    assert refused.headers["ratelimit"] == '"4";r=0'
    await rl.aclose()
