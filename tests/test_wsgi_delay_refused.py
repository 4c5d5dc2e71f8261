"""``delay=`` is the ASGI middleware's (a request waiting in a WSGI server would hold its
worker thread): the WSGI middleware, and Flask's routes made through it, refuse a route
with a delay when made, rather than answer its refusals at once as if it had none."""

from __future__ import annotations

from collections.abc import Iterator

import flask
import pytest

from ratelimit import ConfigurationError
from ratelimit.flask import FlaskRateLimit
from ratelimit.sync import RateLimit
from ratelimit.wsgi import RateLimitMiddleware, Route


@pytest.fixture
def rl() -> Iterator[RateLimit]:
    limiter = RateLimit.from_url("memory://", namespace="wsgi-delay")
    yield limiter
    limiter.close()


def app(environ: object, start_response: object) -> list[bytes]:  # never called
    raise AssertionError


def test_the_wsgi_middleware_refuses_a_delayed_route(rl: RateLimit) -> None:
    with pytest.raises(ConfigurationError, match=r"Route\('/x'.*delay= .*ASGI"):
        RateLimitMiddleware(app, rl, routes=[Route("/x", "ip:1/m", delay=5)])
    RateLimitMiddleware(app, rl, routes=[Route("/x", "ip:1/m")])  # no delay: fine


def test_flask_refuses_a_delayed_route(rl: RateLimit) -> None:
    with pytest.raises(ConfigurationError, match="delay="):
        FlaskRateLimit(rl, flask.Flask(__name__), routes=[Route("/x", "ip:1/m", delay=2)])
