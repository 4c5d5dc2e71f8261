"""Penalties in the WSGI front ends: the middleware's ``Route(penalty=...)`` and a Flask
view's ``limit(..., penalty=...)``; a held request gets 429, ``Retry-After`` the hold's
time left and a problem body that says it is held back. memory:// with a fake clock."""

from __future__ import annotations

import json
from collections.abc import Iterable
from wsgiref.types import StartResponse, WSGIEnvironment
from wsgiref.util import setup_testing_defaults

import pytest
from flask import Flask

from ratelimit import ConfigurationError, MemoryBackend
from ratelimit.flask import FlaskRateLimit
from ratelimit.sync import RateLimit
from ratelimit.wsgi import RateLimitMiddleware, Route
from tests.conftest import FailingBackend, FakeClock

PENALTY = "3 refusals/m for 10m"


def ok(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def call(app: RateLimitMiddleware, ip: str) -> tuple[str, dict[str, str], bytes]:
    environ: WSGIEnvironment = {"REQUEST_METHOD": "POST", "PATH_INFO": "/login"}
    setup_testing_defaults(environ)
    environ["REMOTE_ADDR"] = ip
    answer: list[tuple[str, dict[str, str]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: object = None):  # type: ignore[no-untyped-def]
        answer.append((status, dict(headers)))

    body = b"".join(app(environ, start_response))
    return answer[0][0], answer[0][1], body


def test_middleware_route(clock: FakeClock) -> None:
    rl = RateLimit(MemoryBackend(clock=clock))
    try:
        app = RateLimitMiddleware(ok, rl, [Route("/login", "ip:1/m", penalty=PENALTY)])
        statuses = [call(app, "192.0.2.1")[0][:3] for _ in range(4)]
        assert statuses == ["200", "429", "429", "429"]
        clock.advance(90)  # the rule would admit now
        status, headers, body = call(app, "192.0.2.1")
        assert status.startswith("429")
        assert headers["retry-after"] == "510"
        assert json.loads(body)["penalty"] == 510
        assert call(app, "192.0.2.2")[0].startswith("200")
    finally:
        rl.close()


def test_flask_view(clock: FakeClock) -> None:
    rl = RateLimit(MemoryBackend(clock=clock))
    try:
        app = Flask(__name__)
        limits = FlaskRateLimit(rl, app)

        @app.post("/login")
        @limits.limit("ip:1/m", penalty=PENALTY)
        def login() -> str:
            return "ok"

        client = app.test_client()
        assert [client.post("/login").status_code for _ in range(4)] == [200, 429, 429, 429]
        held = client.post("/login")
        assert held.headers["Retry-After"] == "600"
        assert held.json is not None
        assert "held back for 600 s" in held.json["detail"]
        with pytest.raises(ConfigurationError, match="do not name"):
            limits.limit("ip:1/m", penalty="user: 3 refusals/m for 10m")
    finally:
        rl.close()


def test_a_store_without_penalties_is_refused_when_made() -> None:
    rl = RateLimit(FailingBackend())
    try:
        with pytest.raises(ConfigurationError, match="keeps no penalties"):
            RateLimitMiddleware(ok, rl, [Route("/login", "ip:1/m", penalty=PENALTY)])
    finally:
        rl.close()
