"""``on_error="local"``'s refusals as callers see them: a refusal of this process's local
share (of a rule, or of concurrency slots) is a refusal of the limit, not the storage's
failure under ``on_error="deny"``: a message naming the local share, 429 at the HTTP edge
(not 503), answered by the front end's ``refused=`` function as any 429."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from starlette.responses import PlainTextResponse

from ratelimit import RateLimit
from ratelimit.asgi import HTTPRequest, RateLimitMiddleware, Route, SlotRoute
from ratelimit.core.decision import Decision
from ratelimit.front.concurrency import ConcurrencyLimitExceeded
from ratelimit.sync import RateLimit as SyncRateLimit
from ratelimit.wsgi import RateLimitMiddleware as WSGIMiddleware
from ratelimit.wsgi import Route as WSGIRoute
from tests.conftest import FakeClock
from tests.test_local_fallback import Flaky
from tests.test_wsgi import call, ok

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


async def test_the_asgi_refused_function_answers_a_local_refusal() -> None:
    store = Flaky(FakeClock())
    rl = RateLimit(store, on_error="local", local_share=0.5)

    def refused(request: HTTPRequest, decision: Decision) -> PlainTextResponse:
        return PlainTextResponse(f"slow down ({decision.rule})", status_code=429)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limited = RateLimitMiddleware(app, rl, [Route("/x", "ip:2/h")], refused=refused)
    transport = httpx.ASGITransport(app=limited)
    store.down = True
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answers = [await client.get("/x") for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 429]  # 2 * 0.5 locally
    assert answers[1].text == "slow down (ip:2/h)"
    assert int(answers[1].headers["retry-after"]) >= 1
    await rl.aclose()


def test_the_wsgi_refused_function_answers_a_local_refusal() -> None:
    store = Flaky(FakeClock())
    rl = SyncRateLimit(store, on_error="local", local_share=0.5)

    def refused(request: HTTPRequest, decision: Decision) -> Any:
        def answer(environ: Any, start_response: Any) -> list[bytes]:
            start_response("429 Too Many Requests", [("Content-Type", "text/plain")])
            return [f"slow down ({decision.rule})".encode()]

        return answer

    app = WSGIMiddleware(ok, rl, [WSGIRoute("/x", "ip:2/h")], refused=refused)
    store.down = True
    try:
        answers = [call(app, "/x", REMOTE_ADDR="10.1.1.1") for _ in range(2)]
    finally:
        rl.close()
    assert [status[:3] for status, _ in answers] == ["200", "429"]
    assert answers[1][1]["body"] == b"slow down (ip:2/h)"
