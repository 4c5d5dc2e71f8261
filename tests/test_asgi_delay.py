"""A route's ``delay=``/``waiting=`` in process: refused requests wait their turn instead of
a 429, in an event loop whose clock is its own (``run_virtual``; the limiter counts on that
clock), so waits take no real time and what each request sees is exact. Under real uvicorn
processes sharing one Redis: tests/test_http_delay.py."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

from ratelimit import ConfigurationError, MemoryBackend, RateLimit
from ratelimit.asgi import RateLimitMiddleware, Route, RouteLimit
from tests.conftest import FailingBackend, run_virtual

pytestmark = pytest.mark.timeout(30)

Admitted = list[tuple[str, float]]
T = TypeVar("T")


def served(rl: RateLimit, routes: list[Route], admitted: Admitted) -> Starlette:
    """An application that notes each request it runs: its ``n`` and the loop's time."""

    async def endpoint(request: Request) -> PlainTextResponse:
        body = (await request.body()).decode()
        admitted.append((request.query_params.get("n", ""), asyncio.get_running_loop().time()))
        return PlainTextResponse(body or "ok")

    app = Starlette(routes=[StarletteRoute("/{path:path}", endpoint, methods=["GET", "POST"])])
    app.add_middleware(RateLimitMiddleware, limiter=rl, routes=routes)
    return app


def client(app: Any, peer: str = "10.1.1.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 4000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


LIMITERS: list[RateLimit] = []


def limiter() -> RateLimit:
    """A limiter on memory counting on the loop's clock, closed as the test ends."""
    rl = RateLimit(MemoryBackend(clock=asyncio.get_running_loop().time), "delay")
    LIMITERS.append(rl)
    return rl


def run(main: Callable[[], Awaitable[T]]) -> T:
    """``run(main)``, closing the limiters it made."""

    async def closing() -> T:
        try:
            return await main()
        finally:
            while LIMITERS:
                await LIMITERS.pop().aclose()

    return run_virtual(closing)


async def timed(call: Awaitable[httpx.Response]) -> tuple[httpx.Response, float]:
    """The response and the loop's time it came at."""
    response = await call
    return response, asyncio.get_running_loop().time()


# --- configuration, checked when made ---


@pytest.mark.parametrize("delay", [-1, 61, 1e9, math.nan, math.inf, "2", True, None])
def test_a_bad_delay_is_named(delay: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"Route\('/x'\): delay must be seconds from 0"):
        Route("/x", "ip:5/s", delay=delay)


@pytest.mark.parametrize("waiting", [0, -3, 1.5, True, "10"])
def test_a_bad_waiting_is_named(waiting: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"Route\('/x'\): waiting must be a whole"):
        Route("/x", "ip:5/s", delay=1, waiting=waiting)


def test_waiting_without_a_delay_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="waiting=5 needs a delay="):
        Route("/x", "ip:5/s", waiting=5)


def test_a_delay_on_a_shadow_route_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="shadow limit never refuses"):
        Route("/x", "ip:5/s", delay=1, shadow=True)


def test_no_delay_makes_no_waiting_room() -> None:
    assert Route("/x", "ip:5/s").room is None
    assert Route("/x", "ip:5/s", delay=0).room is None
    room = Route("/x", "ip:5/s", delay=2.5).room
    assert room is not None
    assert (room.delay, room.waiting) == (2.5, 100)


# --- waiting ---


def test_a_spike_is_admitted_as_the_rule_frees_up_to_the_delay() -> None:
    """15 requests at once on ip:5/s with delay=1.5: 5 at once, 5 after a second (never six
    within a second), the last 5 refused once their turn shows they cannot make it."""

    async def main() -> tuple[list[int], list[float], Admitted]:
        admitted: Admitted = []
        app = served(limiter(), [Route("/api/{p:path}", "ip:5/s", delay=1.5)], admitted)
        async with client(app) as http:
            answers = await asyncio.gather(
                *(timed(http.get("/api/x", params={"n": str(n)})) for n in range(15))
            )
        return [r.status_code for r, _ in answers], [t for _, t in answers], admitted

    statuses, _, admitted = run(main)
    assert statuses.count(200) == 10
    assert statuses.count(429) == 5
    times = sorted(t for _, t in admitted)
    assert times[:5] == [0.0] * 5
    assert all(1.0 <= t <= 1.1 + 1e-6 for t in times[5:])  # the window, plus jitter
    for first, sixth in zip(times, times[5:], strict=False):
        assert sixth - first >= 1.0 - 1e-9


def test_waiters_are_admitted_in_the_order_they_came() -> None:
    async def main() -> list[str]:
        admitted: Admitted = []
        app = served(limiter(), [Route("/x", "ip:1/s", delay=10)], admitted)
        async with client(app) as http:
            calls = []
            for n in range(5):
                calls.append(asyncio.ensure_future(http.get("/x", params={"n": str(n)})))
                await asyncio.sleep(0.01)  # n comes after n - 1
            answers = await asyncio.gather(*calls)
        assert [r.status_code for r in answers] == [200] * 5
        return [n for n, _ in admitted]

    assert run(main) == ["0", "1", "2", "3", "4"]


def test_a_newcomer_does_not_overtake_a_waiter_of_its_identifier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule has room again at 1.0, while the waiter sleeps its jitter (to 1.1): a request
    coming at 1.05 queues behind it instead of taking the room."""
    monkeypatch.setattr("ratelimit.asgi.delay.random.random", lambda: 1.0)

    async def main() -> Admitted:
        admitted: Admitted = []
        app = served(limiter(), [Route("/x", "ip:1/s", delay=5)], admitted)
        async with client(app) as http:
            first = await http.get("/x", params={"n": "first"})
            waiter = asyncio.ensure_future(http.get("/x", params={"n": "waiter"}))
            await asyncio.sleep(1.05)
            newcomer = await http.get("/x", params={"n": "newcomer"})
            assert [first.status_code, (await waiter).status_code, newcomer.status_code] == [
                200,
                200,
                200,
            ]
        return admitted

    admitted = run(main)
    assert [n for n, _ in admitted] == ["first", "waiter", "newcomer"]
    assert admitted[1][1] == pytest.approx(1.1)
    assert admitted[2][1] >= admitted[1][1] + 1.0 - 1e-9


def test_other_identifiers_do_not_wait_behind_a_line() -> None:
    async def main() -> tuple[float, Admitted]:
        admitted: Admitted = []
        app = served(limiter(), [Route("/x", "ip:1/s", delay=5)], admitted)
        async with client(app, "10.0.0.1") as one, client(app, "10.0.0.2") as two:
            await one.get("/x", params={"n": "a"})
            waiter = asyncio.ensure_future(one.get("/x", params={"n": "a-waits"}))
            await asyncio.sleep(0.1)
            other, at = await timed(two.get("/x", params={"n": "b"}))
            assert other.status_code == 200
            assert (await waiter).status_code == 200
        return at, admitted

    at, admitted = run(main)
    assert at == pytest.approx(0.1)  # not behind 10.0.0.1's waiter
    assert [n for n, _ in admitted] == ["a", "b", "a-waits"]


def test_the_cap_on_waiting_answers_the_next_at_once() -> None:
    async def main() -> list[tuple[int, float]]:
        admitted: Admitted = []
        app = served(limiter(), [Route("/x", "ip:1/s", delay=10, waiting=2)], admitted)
        async with client(app) as http:
            answers = []
            for n in range(4):
                answers.append(asyncio.ensure_future(timed(http.get("/x", params={"n": str(n)}))))
                await asyncio.sleep(0)
            return [(r.status_code, t) for r, t in await asyncio.gather(*answers)]

    answers = sorted(run(main), key=lambda answer: answer[1])
    assert answers[:2] == [(200, 0.0), (429, 0.0)]  # no room for the third to wait
    assert answers[2][0] == answers[3][0] == 200
    assert 1.0 <= answers[2][1] <= 1.1 + 1e-6
    assert 2.0 <= answers[3][1] <= 2.2 + 1e-6


def test_a_refusal_longer_than_the_delay_is_answered_at_once() -> None:
    async def main() -> tuple[httpx.Response, float]:
        app = served(limiter(), [Route("/x", "ip:1/10s", delay=2)], [])
        async with client(app) as http:
            await http.get("/x")
            return await timed(http.get("/x"))

    refused, at = run(main)
    assert refused.status_code == 429
    assert at == 0.0
    assert refused.headers["retry-after"] == "10"


def test_time_up_in_line_is_a_429_with_the_time_still_to_wait() -> None:
    """Two behind a waiter on ip:1/s with delay=1.5: the first is admitted at 1, the second
    after its turn comes at 1 finds 2 s to wait with 0.5 s left: 429 then, Retry-After 1."""

    async def main() -> list[tuple[int, float, str | None]]:
        app = served(limiter(), [Route("/x", "ip:1/s", delay=1.5)], [])
        async with client(app) as http:
            calls = [asyncio.ensure_future(timed(http.get("/x"))) for _ in range(3)]
            answers = await asyncio.gather(*calls)
        return [(r.status_code, t, r.headers.get("retry-after")) for r, t in answers]

    answers = run(main)
    assert [status for status, _, _ in answers] == [200, 200, 429]
    assert 1.0 <= answers[2][1] <= 1.1 + 1e-6
    assert answers[2][2] == "1"


def test_admitted_after_waiting_carries_the_admitting_decisions_headers() -> None:
    async def main() -> httpx.Response:
        app = served(limiter(), [Route("/x", "ip:2/s", delay=2)], [])
        async with client(app) as http:
            await asyncio.gather(http.get("/x"), http.get("/x"))
            return await http.get("/x")

    waited = run(main)
    assert waited.status_code == 200
    assert waited.headers["ratelimit"] == '"ip:2/s";r=1;t=1'


def test_costs_count_as_before_while_waiting() -> None:
    """cost=2 on ip:4/s: two requests a second, whatever waits."""

    async def main() -> list[float]:
        admitted: Admitted = []
        app = served(limiter(), [Route("/x", "ip:4/s", delay=3, cost=2)], admitted)
        async with client(app) as http:
            statuses = [
                r.status_code for r in await asyncio.gather(*(http.get("/x") for _ in range(6)))
            ]
        assert statuses == [200] * 6
        return sorted(t for _, t in admitted)

    times = run(main)
    for first, third in zip(times, times[2:], strict=False):
        assert third - first >= 1.0 - 1e-9


def test_a_degraded_refusal_never_waits() -> None:
    async def main() -> tuple[int, float]:
        rl = RateLimit(FailingBackend(), "delay", on_error="deny")
        LIMITERS.append(rl)
        app = served(rl, [Route("/x", "ip:1/s", delay=10)], [])
        async with client(app) as http:
            response, at = await timed(http.get("/x"))
        return response.status_code, at

    assert run(main) == (503, 0.0)


def test_the_body_reaches_the_application_after_waiting() -> None:
    async def main() -> list[str]:
        app = served(limiter(), [Route("/x", "ip:1/s", delay=5)], [])
        async with client(app) as http:
            answers = await asyncio.gather(
                *(http.post("/x", content=f"body {n}".encode()) for n in range(3))
            )
        return [r.text for r in answers]

    assert run(main) == ["body 0", "body 1", "body 2"]


# --- a client that leaves while it waits ---


def asgi_request(left: asyncio.Event) -> tuple[dict[str, Any], Callable[[], Awaitable[Any]]]:
    """A GET's scope and a ``receive`` that gives its (empty) body, then ``http.disconnect``
    once ``left`` is set."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/x",
        "raw_path": b"/x",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"test")],
        "client": ("10.1.1.1", 4000),
        "server": ("test", 80),
    }
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    return scope, receive


def test_a_client_that_leaves_stops_waiting() -> None:
    async def main() -> tuple[float, list[dict[str, Any]], int]:
        admitted: Admitted = []
        route = Route("/x", "ip:1/s", delay=10)
        app = served(limiter(), [route], admitted)
        async with client(app) as http:
            await http.get("/x")  # the rule is full for a second
        left = asyncio.Event()
        scope, receive = asgi_request(left)
        sent: list[dict[str, Any]] = []

        async def send(message: Any) -> None:
            sent.append(message)

        clock = asyncio.get_running_loop().time
        waiting = asyncio.ensure_future(app(scope, receive, send))
        await asyncio.sleep(0.5)
        assert route.room is not None
        assert route.room.count == 1
        left.set()
        await waiting
        assert route.room.count == 0
        assert not route.room.lines
        return clock(), sent, len(admitted)

    at, sent, count = run(main)
    assert at == pytest.approx(0.5)  # not 1.0, when it would have been admitted
    assert sent == []  # nobody to answer
    assert count == 1  # the application never saw it


def test_a_waiter_that_stays_is_admitted_and_its_application_reads_on() -> None:
    async def main() -> list[str]:
        admitted: Admitted = []
        app = served(limiter(), [Route("/x", "ip:1/s", delay=10)], admitted)
        async with client(app) as http:
            await http.get("/x")
        left = asyncio.Event()
        scope, receive = asgi_request(left)
        sent: list[dict[str, Any]] = []

        async def send(message: Any) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return [str(m.get("status", m.get("body"))) for m in sent]

    assert run(main) == ["200", "b'ok'"]


# --- RouteLimit ---


def test_a_route_limit_waits_too_with_or_without_the_middleware() -> None:
    """ip:2/s with delay=1.5: of 6 at once, 2 at once, 2 a second later, 2 refused."""

    async def spike(with_middleware: bool) -> list[tuple[int, float]]:
        rl = limiter()
        limit = RouteLimit(rl, "ip:2/s", delay=1.5, waiting=10)

        async def endpoint(request: Request) -> PlainTextResponse:
            await limit.check(request)
            return PlainTextResponse("ok")

        app = Starlette(routes=[StarletteRoute("/x", endpoint)])
        if with_middleware:
            app.add_middleware(RateLimitMiddleware, limiter=rl, routes=[])
        async with client(app) as http:
            answers = await asyncio.gather(*(timed(http.get("/x")) for _ in range(6)))
        return sorted((r.status_code, t) for r, t in answers)

    async def main() -> list[list[tuple[int, float]]]:
        return [await spike(True), await spike(False)]

    for answers in run(main):
        admitted = [t for status, t in answers if status == 200]
        assert [status for status, _ in answers].count(429) == 2
        assert admitted[:2] == [0.0, 0.0] or admitted[0] == admitted[1]
        assert all(t - admitted[0] >= 1.0 - 1e-9 for t in admitted[2:])


def test_a_route_limit_checks_its_delay() -> None:
    async def main() -> None:
        with pytest.raises(ConfigurationError, match=r"RouteLimit\('ip:2/s'\): delay must be"):
            RouteLimit(limiter(), "ip:2/s", delay=-1)
        with pytest.raises(ConfigurationError, match="shadow limit never refuses"):
            RouteLimit(limiter(), "ip:2/s", delay=1, shadow=True)

    run(main)


def test_a_full_room_does_not_let_a_newcomer_overtake_its_identifier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """waiting=1, the rule free again at 1.0 while the waiter sleeps its jitter (to 1.1): a
    request of its identifier coming at 1.05 finds the room full and gets the line's
    refusal at once, instead of asking and taking the waiter's turn."""
    monkeypatch.setattr("ratelimit.asgi.delay.random.random", lambda: 1.0)

    async def main() -> tuple[list[tuple[int, float]], Admitted]:
        admitted: Admitted = []
        app = served(limiter(), [Route("/x", "ip:1/s", delay=5, waiting=1)], admitted)
        async with client(app) as http:
            await http.get("/x", params={"n": "first"})
            waiter = asyncio.ensure_future(timed(http.get("/x", params={"n": "waiter"})))
            await asyncio.sleep(1.05)
            newcomer = await timed(http.get("/x", params={"n": "newcomer"}))
            answers = [await waiter, newcomer]
        return [(r.status_code, t) for r, t in answers], admitted

    answers, admitted = run(main)
    assert [status for status, _ in answers] == [200, 429]
    assert [at for _, at in answers] == pytest.approx([1.1, 1.05])
    assert [n for n, _ in admitted] == ["first", "waiter"]
