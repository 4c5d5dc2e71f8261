"""Issue 37, item 4: a function of the request reads headers by name in any case, as HTTP's
names are: ``request.headers.get("X-API-Key")`` finds the ``x-api-key`` a server hands on.
Before, ``headers`` was a dict of lower-case names, so that natural spelling was always
``None`` and the limit silently did not apply. Checked with real requests through every
front end that hands a request view to a user's function: the ASGI middleware, a route
dependency and a settle function under a real uvicorn; the WSGI middleware under a real
``wsgiref`` server; Flask's and Django's test clients."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from ratelimit import MemoryBackend
from ratelimit.asgi import HTTPRequest
from ratelimit.asgi.header_map import HeaderMap
from ratelimit.sync import RateLimit
from tests.http_server import UvicornServer

pytestmark = pytest.mark.timeout(60)


def api_key(request: HTTPRequest) -> str | None:
    return request.headers.get("X-API-Key")


def test_the_header_map_reads_names_in_any_case() -> None:
    raw = [(b"x-api-key", b"k1"), (b"accept", b"a"), (b"Accept", b"b"), (b"host", b"h")]
    headers = HeaderMap(raw)
    assert headers.get("X-API-Key") == headers["x-api-key"] == headers["X-Api-KEY"] == "k1"
    assert headers["ACCEPT"] == "a, b"  # lines of one field joined, in order (RFC 9110 5.3)
    assert headers.values_of("Accept") == ["a", "b"]
    assert "X-API-KEY" in headers
    assert "x-missing" not in headers
    assert 7 not in headers  # type: ignore[comparison-overlap]
    assert headers.get("X-Missing") is None
    assert headers.get("X-Missing", "none") == "none"
    assert headers.get("x-\u20ac") is None  # no header's name: absent, not an error
    with pytest.raises(KeyError):
        headers["X-Missing"]
    assert list(headers) == ["x-api-key", "accept", "host"]
    assert len(headers) == 3
    assert dict(headers) == {"x-api-key": "k1", "accept": "a, b", "host": "h"}
    assert headers["Host"] == "h"  # after the fields were joined, too
    assert headers == {"x-api-key": "k1", "accept": "a, b", "host": "h"}


def test_the_request_views_header_methods_read_any_case() -> None:
    request = HTTPRequest({"type": "http", "headers": [(b"x-api-key", b"k1")]})
    assert request.header("X-API-Key") == "k1"
    assert request.header_values("X-Api-Key") == ["k1"]
    assert request.headers["X-API-KEY"] == "k1"


@pytest.fixture(scope="module")
def server() -> Iterator[UvicornServer]:
    with UvicornServer("tests.header_case_apps:app", factory=True) as running:
        yield running


@pytest.mark.parametrize("path", ["/middleware", "/dependency"])
def test_a_function_source_reads_the_header_as_clients_spell_it(
    server: UvicornServer, path: str
) -> None:
    key = uuid.uuid4().hex
    with server.sync_client(timeout=10) as http:
        answers = [http.get(path, headers={"X-API-Key": key}).status_code for _ in range(3)]
        other = http.get(path, headers={"X-API-Key": key + "-other"}).status_code
    assert answers == [200, 200, 429]  # before: 200 x 3, the limit never applied
    assert other == 200  # per key, not one counter for everybody


def test_a_settle_function_reads_the_response_header_as_the_app_spells_it(
    server: UvicornServer,
) -> None:
    # each response says X-Cost: 5, all of apikey:5/m: the second request is refused
    key = uuid.uuid4().hex
    with server.sync_client(timeout=10) as http:
        answers = [http.get("/settled", headers={"X-API-Key": key}).status_code for _ in "ab"]
    assert answers == [200, 429]  # before: X-Cost was not found, 1 was counted: 200, 200


def test_the_wsgi_middleware() -> None:
    from ratelimit.wsgi import RateLimitMiddleware, Route
    from tests.test_wsgi import ok, serving

    rl = RateLimit(MemoryBackend())
    app = RateLimitMiddleware(ok, rl, [Route("/keyed", "apikey:2/m", apikey=api_key)])
    try:
        with serving(app) as http:
            answers = [http.get("/keyed", headers={"X-API-Key": "k"}).status_code for _ in "abc"]
    finally:
        rl.close()
    assert answers == [200, 200, 429]


def test_flask_views_and_routes() -> None:
    from flask import Flask

    from ratelimit.flask import FlaskRateLimit, Route

    rl = RateLimit(MemoryBackend())
    app = Flask(__name__)
    limits = FlaskRateLimit(rl, app, routes=[Route("/routed", "apikey:2/m", apikey=api_key)])

    @app.get("/view")
    @limits.limit("apikey:2/m", apikey=api_key)
    def view() -> str:
        return "ok"

    @app.get("/routed")
    def routed() -> str:
        return "ok"

    client = app.test_client()
    try:
        for path in ("/view", "/routed"):
            answers = [client.get(path, headers={"X-API-Key": "k"}).status_code for _ in "abc"]
            assert answers == [200, 200, 429], path
    finally:
        rl.close()


def view_by_key(request: Any) -> Any:
    from django.http import HttpResponse

    return HttpResponse("ok")


def test_django_views_and_routes() -> None:
    from django.test import Client, override_settings
    from django.urls import path

    from ratelimit.django import Route, limit
    from tests import django_project  # configures Django first

    run = uuid.uuid4().hex

    class Urls:
        urlpatterns: ClassVar[list[Any]] = [
            path("view", limit("apikey:2/m", key=f"view-{run}", apikey=api_key)(view_by_key)),
            path("routed", view_by_key),
        ]

    settings = {
        **django_project.RATELIMIT,
        "routes": [Route("/routed", "apikey:2/m", key=f"routed-{run}", apikey=api_key)],
    }
    with override_settings(ROOT_URLCONF=Urls, RATELIMIT=settings):
        client = Client()
        for where in ("/view", "/routed"):
            answers = [client.get(where, headers={"X-API-Key": "k"}).status_code for _ in "abc"]
            assert answers == [200, 200, 429], where
