"""``count_when``: count only the calls that failed (flask-limiter's ``deduct_when``), on the
reserve/settle machinery: each call is decided and its cost reserved, and one that its
outcome says does not count is refunded as it ends. On the decorator (by return value or
exception, on every store), ``async with``, the sync API, the ASGI and WSGI routes (by
response status) and the Flask and Django view limits."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

import ratelimit.sync
from ratelimit import ConfigurationError, MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.asgi import Route

pytestmark = pytest.mark.timeout(60)


class BadPassword(Exception):
    pass


async def test_only_failed_logins_count_by_return_value(rl: RateLimit) -> None:
    @rl.limit("username:3/m", count_when=lambda ok: not ok)
    async def login(username: str, password: str) -> bool:
        return password == "right"

    for _ in range(5):  # successes are refunded: never refused
        assert await login("ann", "right")
    assert [await login("ann", "wrong") for _ in range(3)] == [False] * 3
    with pytest.raises(RateLimitExceeded):
        await login("ann", "right")  # three failures: the fourth call is refused


async def test_only_the_exceptions_it_names_count(rl: RateLimit) -> None:
    @rl.limit("username:2/m", count_when=lambda outcome: isinstance(outcome, BadPassword))
    async def login(username: str, password: str) -> str:
        if password == "oops":
            raise ValueError("a bug, not the caller's")
        if password != "right":
            raise BadPassword(username)
        return "token"

    for _ in range(3):
        with pytest.raises(ValueError, match="a bug"):
            await login("bob", "oops")  # refunded: another exception
        assert await login("bob", "right") == "token"
    for _ in range(2):
        with pytest.raises(BadPassword):
            await login("bob", "wrong")
    with pytest.raises(RateLimitExceeded):
        await login("bob", "right")


async def test_async_with_and_an_async_count_when() -> None:
    rl = RateLimit(MemoryBackend())

    async def failed(outcome: object) -> bool:
        return outcome is not None  # the block raised

    limit = rl.limit("2/m", key="block", count_when=failed)
    for _ in range(4):
        async with limit:
            pass
    for _ in range(2):
        with pytest.raises(BadPassword):
            async with limit:
                raise BadPassword()
    with pytest.raises(RateLimitExceeded):
        async with limit:
            pass


async def test_count_when_and_settle_together() -> None:
    rl = RateLimit(MemoryBackend(), algorithm="sliding-window")

    @rl.limit(
        "90 tokens/m",
        key="complete",
        cost={"tokens": 30},
        settle=lambda used: {"tokens": used},
        count_when=lambda used: used > 0,
    )
    async def complete(used: int) -> int:
        return used

    assert [await complete(0) for _ in range(5)] == [0] * 5  # refunded whole
    assert await complete(60) == 60  # settled at 60 of the 90
    peeked = await rl.limit("90 tokens/m", key="complete").peek(cost={"tokens": 30})
    assert peeked.remaining == 0  # 60 counted: one more call of 30 fits, none after


def test_count_when_needs_a_store_that_settles() -> None:
    rl = RateLimit(MemoryBackend(), background=True)
    with pytest.raises(ConfigurationError, match="background=False"):
        rl.limit("5/m", count_when=lambda outcome: True)
    with pytest.raises(TypeError, match="count_when must be a callable"):
        RateLimit(MemoryBackend()).limit("5/m", count_when=True)  # type: ignore[call-overload]


def test_the_sync_api_counts_only_what_failed() -> None:
    with ratelimit.sync.RateLimit.from_url("memory://") as rl:

        @rl.limit("user:2/m", count_when=lambda ok: not ok)
        def login(user: str, ok: bool) -> bool:
            return ok

        assert all(login("u", True) for _ in range(4))
        assert [login("u", False) for _ in range(2)] == [False, False]
        with pytest.raises(RateLimitExceeded):
            login("u", True)
        with rl.limit("2/m", key="block", count_when=lambda raised: raised is not None):
            pass
        assert rl.limit("2/m", key="block").peek().remaining == 1  # the block was refunded


async def test_an_asgi_route_counts_only_the_statuses_given() -> None:
    pytest.importorskip("starlette")
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route as Endpoint

    from ratelimit.asgi import RateLimitMiddleware

    async def login(request: Request) -> PlainTextResponse:
        ok = request.query_params.get("password") == "right"
        return PlainTextResponse("ok" if ok else "no", status_code=200 if ok else 401)

    rl = RateLimit.from_url("memory://", f"count-{uuid.uuid4().hex[:6]}")
    app = Starlette(routes=[Endpoint("/login", login, methods=["POST"])])
    app.add_middleware(
        RateLimitMiddleware,
        limiter=rl,
        routes=[Route("/login", "ip:2/m", methods=["POST"], count_when={401})],
    )
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        right = [await http.post("/login?password=right") for _ in range(4)]
        assert [r.status_code for r in right] == [200] * 4  # each refunded
        wrong = [await http.post("/login?password=wrong") for _ in range(3)]
        assert [r.status_code for r in wrong] == [401, 401, 429]


def test_flask_routes_and_views_count_only_what_they_say() -> None:
    flask = pytest.importorskip("flask")
    from ratelimit.flask import FlaskRateLimit

    with ratelimit.sync.RateLimit.from_url("memory://") as rl:
        app = flask.Flask("count_when")
        broken = Route("/report", "ip:2/m", count_when=lambda request, r: r.status >= 500)
        limits = FlaskRateLimit(rl, app, routes=[broken])

        @app.post("/login")  # type: ignore[untyped-decorator]
        @limits.limit("ip:2/m", count_when={401})
        def login() -> Any:
            ok = flask.request.args.get("password") == "right"
            return ("ok", 200) if ok else ("no", 401)

        @app.get("/report")  # type: ignore[untyped-decorator]
        def report() -> Any:
            return ("ok", 200) if flask.request.args.get("fail") is None else ("down", 503)

        http = app.test_client()
        assert [http.post("/login?password=right").status_code for _ in range(4)] == [200] * 4
        codes = [http.post("/login?password=wrong").status_code for _ in range(3)]
        assert codes == [401, 401, 429]
        assert [http.get("/report").status_code for _ in range(4)] == [200] * 4
        assert [http.get("/report?fail=1").status_code for _ in range(3)] == [503, 503, 429]


def test_a_django_view_counts_only_what_it_says() -> None:
    pytest.importorskip("django")
    from django.http import HttpRequest, HttpResponse
    from django.test import RequestFactory

    from ratelimit.django import limit
    from tests import django_project

    @limit("ip:2/m", key=f"count-{uuid.uuid4().hex[:6]}", count_when={401})
    def login(request: HttpRequest) -> HttpResponse:
        ok = request.GET.get("password") == "right"
        return HttpResponse("ok" if ok else "no", status=200 if ok else 401)

    assert django_project.rl is not None
    factory = RequestFactory()
    assert [login(factory.post("/login?password=right")).status_code for _ in range(4)] == [200] * 4
    codes = [login(factory.post("/login?password=wrong")).status_code for _ in range(3)]
    assert codes == [401, 401, 429]


async def test_an_async_django_view_counts_only_what_it_says() -> None:
    pytest.importorskip("django")
    from django.http import HttpRequest, HttpResponse
    from django.test import RequestFactory

    from ratelimit.django import limit
    from tests import django_project

    @limit("ip:2/m", key=f"count-async-{uuid.uuid4().hex[:6]}", count_when={401})
    async def login(request: HttpRequest) -> HttpResponse:
        ok = request.GET.get("password") == "right"
        return HttpResponse("ok" if ok else "no", status=200 if ok else 401)

    assert django_project.rl is not None
    factory = RequestFactory()
    right = [(await login(factory.post("/login?password=right"))).status_code for _ in range(4)]
    assert right == [200] * 4
    wrong = [(await login(factory.post("/login?password=wrong"))).status_code for _ in range(3)]
    assert wrong == [401, 401, 429]


def test_a_view_that_raises_counts_as_the_status_it_is_answered_with() -> None:
    flask = pytest.importorskip("flask")
    from ratelimit.flask import FlaskRateLimit

    with ratelimit.sync.RateLimit.from_url("memory://") as rl:
        app = flask.Flask("count_raised")
        limits = FlaskRateLimit(rl, app)

        @app.get("/item")  # type: ignore[untyped-decorator]
        @limits.limit("ip:2/m", count_when={401})
        def item() -> Any:
            if flask.request.args.get("missing"):
                flask.abort(404)  # not a failure it counts: refunded
            flask.abort(401)

        http = app.test_client()
        assert [http.get("/item?missing=1").status_code for _ in range(4)] == [404] * 4
        assert [http.get("/item").status_code for _ in range(3)] == [401, 401, 429]


def test_a_django_view_that_raises_counts_as_its_status() -> None:
    pytest.importorskip("django")
    from django.http import Http404, HttpRequest, HttpResponse
    from django.test import RequestFactory

    from ratelimit.django import limit
    from tests import django_project

    @limit("ip:2/m", key=f"count-raise-{uuid.uuid4().hex[:6]}", count_when=range(500, 600))
    def report(request: HttpRequest) -> HttpResponse:
        if request.GET.get("missing"):
            raise Http404("no such report")
        raise RuntimeError("the report broke")

    assert django_project.rl is not None
    factory = RequestFactory()
    for _ in range(4):  # 404s are refunded
        with pytest.raises(Http404):
            report(factory.get("/report?missing=1"))
    for _ in range(2):  # server errors count
        with pytest.raises(RuntimeError, match="broke"):
            report(factory.get("/report"))
    assert report(factory.get("/report")).status_code == 429


async def test_an_asgi_app_that_raises_counts_as_a_server_error() -> None:
    from ratelimit.asgi import RateLimitMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/crash":
            raise RuntimeError("crashed")
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    rl = RateLimit.from_url("memory://", f"count-crash-{uuid.uuid4().hex[:6]}")
    limited = RateLimitMiddleware(
        app, rl, [Route("/*", "ip:2/m", key="all", count_when=range(500, 600))]
    )
    transport = httpx.ASGITransport(limited, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        assert [(await http.get("/missing")).status_code for _ in range(4)] == [404] * 4
        crashed = [(await http.get("/crash")).status_code for _ in range(3)]
    assert crashed == [500, 500, 429]


def test_count_when_of_a_route_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="holds no HTTP status"):
        Route("/a", "5/m", count_when=[600, 700])
    with pytest.raises(TypeError, match="count_when must be the statuses"):
        Route("/a", "5/m", count_when="401")  # type: ignore[arg-type]
