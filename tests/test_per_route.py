"""``Route(..., per_route=True)``: one limit that gives every route of the application
counters of its own, by method and path template (slowapi's and flask-limiter's
``default_limits``), in each front end: the ASGI middleware on a Starlette app (mounts
included, read from its router), Flask (its URL rules) and Django (its URL patterns), where
a view with a limit of its own is left to it.
``/items/1`` and ``/items/2`` share ``GET /items/{id}``'s counter; ``POST /items`` and a
route of its own do not; paths no route serves share one."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from ratelimit import ConfigurationError, RateLimit
from ratelimit.asgi import Route

pytestmark = pytest.mark.timeout(30)


def statuses(answers: list[Any]) -> list[int]:
    return [answer.status_code for answer in answers]


async def test_the_asgi_middleware_counts_per_method_and_template() -> None:
    pytest.importorskip("starlette")
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount
    from starlette.routing import Route as Endpoint

    from ratelimit.asgi import RateLimitMiddleware

    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Endpoint("/items/{id}", ok, methods=["GET", "POST"]),
            Endpoint("/login", ok, methods=["POST"]),
            Mount("/api", routes=[Endpoint("/users/{user_id}", ok)]),
        ]
    )
    rl = RateLimit.from_url("memory://", f"per-route-{uuid.uuid4().hex[:6]}")
    app.add_middleware(
        RateLimitMiddleware,
        limiter=rl,
        routes=[
            Route("/login", "ip:1/m", methods=["POST"]),  # its own limit: the first match
            Route("/*", "ip:2/m", per_route=True),
        ],
    )
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        items = [await http.get(f"/items/{n}") for n in range(3)]
        assert statuses(items) == [200, 200, 429]  # one template: one counter
        assert statuses([await http.post("/items/9") for _ in range(2)]) == [200, 200]
        assert statuses([await http.head("/items/9")]) == [429]  # HEAD counts as GET
        users = [await http.get(f"/api/users/{n}") for n in range(3)]
        assert statuses(users) == [200, 200, 429]
        assert statuses([await http.post("/login") for _ in range(2)]) == [200, 429]
        missing = [await http.get(f"/nothing/{n}") for n in range(3)]
        assert statuses(missing) == [404, 404, 429]  # no route: one shared counter
    await rl.overrides.refresh()  # announced: an override can name "/* GET /items/{id}"
    assert await rl.overrides.known("/* GET /items/{id}")
    assert await rl.overrides.known("/* GET /api/users/{user_id}")
    await rl.aclose()


def test_flask_counts_per_method_and_url_rule() -> None:
    flask = pytest.importorskip("flask")
    import ratelimit.sync
    from ratelimit.flask import FlaskRateLimit

    with ratelimit.sync.RateLimit.from_url("memory://") as rl:
        app = flask.Flask("per_route")
        limits = FlaskRateLimit(rl, app, routes=[Route("/*", "ip:2/m", per_route=True)])

        @app.route("/items/<int:item>", methods=["GET", "POST"])  # type: ignore[untyped-decorator]
        def item(item: int) -> str:
            return "ok"

        @app.get("/login")  # type: ignore[untyped-decorator]
        @limits.limit("ip:5/m")  # a limit of its own: the default leaves it alone
        def login() -> str:
            return "ok"

        http = app.test_client()
        assert statuses([http.get("/login") for _ in range(5)]) == [200] * 5
        assert statuses([http.get(f"/items/{n}") for n in range(3)]) == [200, 200, 429]
        assert statuses([http.post("/items/1") for _ in range(3)]) == [200, 200, 429]
        assert statuses([http.get(f"/none/{n}") for n in range(3)]) == [404, 404, 429]


def test_django_counts_per_method_and_url_pattern() -> None:
    pytest.importorskip("django")
    from django.test import Client, override_settings

    from tests import django_project

    own = {**django_project.RATELIMIT, "routes": [Route("/*", "ip:2/m", per_route=True)]}
    with override_settings(RATELIMIT=own):
        run = uuid.uuid4().int
        http = Client(REMOTE_ADDR=f"10.{run % 250}.{run // 250 % 250}.{run // 62500 % 250}")
        assert statuses([http.get("/ping") for _ in range(3)]) == [200, 200, 429]
        assert statuses([http.get("/keyed") for _ in range(3)]) == [200, 200, 429]  # its own
        assert statuses([http.get("/health")]) == [200]  # excluded: never counted
        # a view with a limit of its own (@limit("item:2/m")) is left to it, as defaults are
        assert statuses([http.get(f"/items/{n}") for n in range(3)]) == [200, 200, 200]


def test_per_route_needs_templates_under_plain_wsgi() -> None:
    import ratelimit.sync
    from ratelimit.wsgi import RateLimitMiddleware

    def app(environ: Any, start_response: Any) -> list[bytes]:
        return []

    with ratelimit.sync.RateLimit.from_url("memory://") as rl:
        with pytest.raises(ConfigurationError, match="per_route=True needs the application"):
            RateLimitMiddleware(app, rl, [Route("/*", "ip:2/m", per_route=True)])
        RateLimitMiddleware(
            app, rl, [Route("/*", "ip:2/m", per_route=True)], templates=lambda e: "/x"
        )


def test_per_route_is_checked() -> None:
    with pytest.raises(TypeError, match="per_route must be True or False"):
        Route("/*", "ip:2/m", per_route="yes")  # type: ignore[arg-type]
    route = Route("/*", "ip:2/m", per_route=True)
    assert route.key_for("HEAD", "/items/{id}") == "/* GET /items/{id}"
    assert route.key_for("POST", None) == "/* POST (no route)"
    assert route.key_for("X7", "/items/{id}") == "/* OTHER /items/{id}"  # one bucket
    assert Route("/a", "5/m").key_for("GET", "/a") == "/a"
