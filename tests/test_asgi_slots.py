"""``SlotRoute`` (issue 39): at most N requests in flight at the HTTP edge, slots kept for
critical ones; held until the response ends (streamed bodies, errors, disconnects), 429 with
the full-limit headers when none is free. In process (httpx's ASGI transport) and under a
real uvicorn; checked when made."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn

from ratelimit import ConfigurationError, RateLimit, RuleSyntaxError
from ratelimit.asgi import RateLimitMiddleware, Route, SlotRoute, header
from tests.conftest import FailingBackend
from tests.redis_server import free_port

pytestmark = pytest.mark.timeout(60)


class Gate:
    """An application whose requests hold until the test opens the gate; ``/stream``
    streams one chunk, then holds before the last; ``/boom`` raises."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.inside = 0
        self.entered = asyncio.Event()  # set on each entry (cleared by whoever waits)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.inside += 1
        self.entered.set()
        try:
            if scope["path"] == "/boom":
                raise RuntimeError("boom")
            headers = [(b"content-type", b"text/plain")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            if scope["path"].startswith("/stream"):
                await send({"type": "http.response.body", "body": b"a", "more_body": True})
            await self.open.wait()
            await send({"type": "http.response.body", "body": b"ok"})
        finally:
            self.inside -= 1

    async def until_inside(self, count: int) -> None:
        while self.inside < count:
            self.entered.clear()
            await self.entered.wait()


def slotted(rl: RateLimit, gate: Gate, *routes: Any, **options: Any) -> RateLimitMiddleware:
    default = SlotRoute("/*", "3", reserve={"critical": 1}, priority=header("x-priority"))
    return RateLimitMiddleware(gate, rl, list(routes) or [default], **options)


def test_slot_routes_are_checked_when_made() -> None:
    with pytest.raises(RuleSyntaxError, match="a span"):
        SlotRoute("/x", "5/s")
    with pytest.raises(ConfigurationError, match="'/x' must start|starts with '/'"):
        SlotRoute("x", "5")
    with pytest.raises(ConfigurationError, match=r"SlotRoute\('/x'\): reserve= keeps slots .* "):
        SlotRoute("/x", "5", reserve={"critical": 1})
    with pytest.raises(ConfigurationError, match="keeps 5 slots .* of limit '5'"):
        SlotRoute("/x", "5", reserve={"critical": 5}, priority=header("x-priority"))
    with pytest.raises(ConfigurationError, match="tier is not a selector of its slots"):
        SlotRoute("/x", "5", tier=header("x-tier"))
    with pytest.raises(ConfigurationError, match="select 'user' but no source"):
        SlotRoute("/x", "user:5")
    with pytest.raises(ConfigurationError, match="unknown method FETCH"):
        SlotRoute("/x", "5", methods=["FETCH"])
    with pytest.raises(ConfigurationError, match="wait must be seconds"):
        SlotRoute("/x", "5", wait=-1)
    with pytest.raises(ConfigurationError, match="holds no concurrency slots"):
        RateLimitMiddleware(Gate(), RateLimit(FailingBackend()), [SlotRoute("/x", "5")])
    route = SlotRoute("/x/*", "ip:2 | 5", methods="GET")
    assert route.key == "GET /x/*"
    assert route.match("HEAD", "/x/y") == {}
    assert route.match("POST", "/x/y") is None


@contextlib.asynccontextmanager
async def in_process(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, client=("10.1.1.1", 4000))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


async def test_the_n_plus_first_request_is_refused_and_a_critical_one_gets_in() -> None:
    rl = RateLimit.from_url("memory://")
    gate = Gate()
    async with in_process(slotted(rl, gate)) as client:
        held = [asyncio.create_task(client.get("/work")) for _ in range(2)]
        await gate.until_inside(2)
        refused = await client.get("/work", headers={"x-priority": "low"})
        assert refused.status_code == 429
        assert refused.headers["content-type"] == "application/problem+json"
        assert "retry-after" in refused.headers
        assert refused.headers["ratelimit"].startswith('"2";r=0')  # the slots it may use
        held.append(asyncio.create_task(client.get("/work", headers={"x-priority": "critical"})))
        await gate.until_inside(3)
        full = await client.get("/work", headers={"x-priority": "critical"})
        assert full.status_code == 429
        assert gate.inside == 3
        gate.open.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200] * 3
        assert (await client.get("/work")).status_code == 200  # every slot came back
    await rl.aclose()


async def test_the_slot_is_held_until_the_response_ends_and_freed_on_errors() -> None:
    rl = RateLimit.from_url("memory://")
    gate = Gate()
    app = slotted(rl, gate, SlotRoute("/*", "1"))
    async with in_process(app) as client:
        streaming = asyncio.create_task(client.get("/stream"))
        await gate.until_inside(1)  # its first chunk is sent; the last is not
        assert (await client.get("/other")).status_code == 429
        gate.open.set()
        assert (await streaming).text == "aok"
        with pytest.raises(RuntimeError, match="boom"):
            await client.get("/boom")
        assert (await client.get("/after")).status_code == 200  # the error gave it back
    await rl.aclose()


async def test_rates_refuse_first_and_excluded_paths_take_no_slot() -> None:
    rl = RateLimit.from_url("memory://", denial_cache=0)
    gate = Gate()
    gate.open.set()
    routes = [Route("/limited", "ip:1/m"), SlotRoute("/*", "1", key="all")]
    app = slotted(rl, gate, *routes, exclude=["/health"])
    async with in_process(app) as client:
        assert (await client.get("/limited")).status_code == 200
        assert (await client.get("/limited")).status_code == 429  # refused by rate: no slot
        gate.open.clear()
        held = asyncio.create_task(client.get("/work"))
        await gate.until_inside(1)
        gate.open.set()  # /health runs now, the held one may finish too
        assert (await client.get("/health")).status_code == 200
        assert (await held).status_code == 200
    await rl.aclose()


async def test_a_disconnected_client_gives_its_slot_back() -> None:
    rl = RateLimit.from_url("memory://")
    gate = Gate()
    app = slotted(rl, gate, SlotRoute("/*", "1"))
    async with in_process(app) as client:
        held = asyncio.create_task(client.get("/work"))
        await gate.until_inside(1)
        held.cancel()  # the client goes away: the application's task is cancelled with it
        with contextlib.suppress(asyncio.CancelledError):
            await held
        gate.open.set()
        assert (await client.get("/after")).status_code == 200
    await rl.aclose()


@pytest.mark.redis
async def test_under_uvicorn_on_a_real_redis(redis_url: str, namespace: str) -> None:
    """A real server and a real Redis: two requests held by the application, the third
    ordinary one 429 with the full-limit headers, a critical one admitted."""
    rl = RateLimit.from_url(redis_url, namespace=namespace, timeout=5, on_error="raise")
    gate = Gate()
    port = free_port()
    config = uvicorn.Config(slotted(rl, gate), port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:  # uvicorn sets a flag, not an event: polled
            assert not serving.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            held = [asyncio.create_task(client.get("/work")) for _ in range(2)]
            await gate.until_inside(2)
            refused = await client.get("/work")
            assert refused.status_code == 429
            assert refused.headers["ratelimit"].startswith('"2";r=0')
            held.append(
                asyncio.create_task(client.get("/work", headers={"x-priority": "critical"}))
            )
            await gate.until_inside(3)
            gate.open.set()
            assert [r.status_code for r in await asyncio.gather(*held)] == [200] * 3
    finally:
        server.should_exit = True
        await serving
        await rl.aclose()


async def test_an_open_websocket_holds_its_slot_and_a_full_route_refuses_the_handshake() -> None:
    rl = RateLimit.from_url("memory://")
    closed = asyncio.Event()
    opened = asyncio.Event()

    async def sockets(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        opened.set()
        await closed.wait()
        await send({"type": "websocket.close", "code": 1000})

    app = RateLimitMiddleware(sockets, rl, [SlotRoute("/ws", "1", methods=["WEBSOCKET"])])
    handshake = {
        "type": "websocket", "path": "/ws", "query_string": b"", "headers": [],
        "client": ("10.0.0.1", 1), "extensions": {"websocket.http.response": {}},
    }  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    first: list[Any] = []
    second: list[Any] = []
    third: list[Any] = []

    def sender(into: list[Any]) -> Any:
        async def send(message: Any) -> None:
            into.append(message)

        return send

    open_socket = asyncio.create_task(app(dict(handshake), receive, sender(first)))
    await opened.wait()
    await app(dict(handshake), receive, sender(second))
    assert second[0]["type"] == "websocket.http.response.start"
    assert second[0]["status"] == 429
    closed.set()
    await open_socket
    assert [m["type"] for m in first] == ["websocket.accept", "websocket.close"]
    closed.clear()
    opened.clear()
    reopened = asyncio.create_task(app(dict(handshake), receive, sender(third)))
    await opened.wait()  # the closed socket gave its slot back
    closed.set()
    await reopened
    assert third[0]["type"] == "websocket.accept"
    await rl.aclose()
