"""The HTTP edge in process (httpx's ASGI transport, memory storage): which forwarding
header is believed, clients with no address (unix sockets), paths under ``root_path``, and
selector values read by type. The same under a real uvicorn is in tests/test_http_edges.py."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter, ValidationError
from starlette._utils import get_route_path
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

from ratelimit import ConfigurationError, MemoryBackend, RateLimit
from ratelimit.asgi import (
    RateLimitMiddleware,
    Route,
    RouteLimit,
    SourceValueError,
    TrustedProxies,
    header,
    json_field,
    path_param,
    query_param,
)
from ratelimit.asgi.request import route_path
from ratelimit.asgi.values import as_text, to_bool, to_int

pytestmark = pytest.mark.timeout(30)

ASGI = Callable[[Any, Any, Any], Awaitable[None]]


def scope(peer: str | None, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"client": None if peer is None else (peer, 1), "headers": list(headers)}


def app_with(routes: list[Route], **options: Any) -> Starlette:
    async def plain(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[StarletteRoute("/{path:path}", plain, methods=["GET", "POST"])])
    rl = RateLimit(MemoryBackend())
    app.add_middleware(RateLimitMiddleware, limiter=rl, routes=routes, **options)
    return app


def client(app: ASGI, peer: str = "10.0.0.1", root_path: str = "") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 4000), root_path=root_path)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def statuses(answers: list[httpx.Response]) -> list[int]:
    return [answer.status_code for answer in answers]


# --- item 1: only the header the trusted proxy sets ---

XFF = (b"x-forwarded-for", b"1.1.1.1")
FORWARDED = (b"forwarded", b"for=2.2.2.2")
REAL_IP = (b"x-real-ip", b"3.3.3.3")


@pytest.mark.parametrize(
    ("header_name", "expected"),
    [("x-forwarded-for", "1.1.1.1"), ("forwarded", "2.2.2.2"), ("X-Real-IP", "3.3.3.3")],
)
def test_only_the_named_header_is_read(header_name: str, expected: str) -> None:
    proxies = TrustedProxies(["10.0.0.0/8"], forwarded_header=header_name)
    assert proxies.client(scope("10.0.0.1", XFF, FORWARDED, REAL_IP)) == expected
    assert proxies.client(scope("10.0.0.1", FORWARDED, REAL_IP, XFF)) == expected
    others = [h for h in (XFF, FORWARDED, REAL_IP) if h[0] != header_name.lower().encode()]
    assert proxies.client(scope("10.0.0.1", *others)) == "10.0.0.1"  # the proxy itself


def test_the_default_is_x_forwarded_for() -> None:
    proxies = TrustedProxies(["10.0.0.0/8"])
    assert proxies.forwarded_header == "x-forwarded-for"
    assert proxies.client(scope("10.0.0.1", FORWARDED, XFF)) == "1.1.1.1"


def test_repeated_lines_are_one_chain_in_order() -> None:
    proxies = TrustedProxies(["10.0.0.0/8"])
    lines = [(b"x-forwarded-for", b"6.6.6.6, 7.7.7.7"), (b"x-forwarded-for", b"1.2.3.4, 10.0.0.9")]
    assert proxies.chain(scope("10.0.0.1", *lines)) == ["6.6.6.6", "7.7.7.7", "1.2.3.4", "10.0.0.9"]
    assert proxies.client(scope("10.0.0.1", *lines)) == "1.2.3.4"
    rfc7239 = TrustedProxies(["10.0.0.0/8"], forwarded_header="forwarded")
    lines = [(b"forwarded", b"for=6.6.6.6"), (b"forwarded", b'for="1.2.3.4:80";proto=https')]
    assert rfc7239.client(scope("10.0.0.1", *lines)) == "1.2.3.4"


def test_forwarded_commas_always_separate_and_quotes_come_off() -> None:
    """No node holds a comma or a semicolon, so each one separates, quoted or not: what a
    client writes inside quotes adds entries to the left of its proxy's, never hides it."""
    rfc7239 = TrustedProxies(["10.0.0.0/8"], forwarded_header="forwarded")
    written = (b"forwarded", b'for="9.9.9.9, for=8.8.8.8;by=\\"x\\"";proto=http, For=1.2.3.4')
    assert rfc7239.chain(scope("10.0.0.1", written)) == ["9.9.9.9", "8.8.8.8", "1.2.3.4"]
    assert rfc7239.client(scope("10.0.0.1", written)) == "1.2.3.4"
    bracketed = (b"forwarded", b'for="[2001:db8::1]:4711"')
    assert rfc7239.chain(scope("10.0.0.1", bracketed)) == ["2001:db8::1"]
    assert rfc7239.client(scope("10.0.0.1", (b"forwarded", b"for=unknown"))) == "unknown"


def test_star_trusts_the_peer_not_what_the_header_says() -> None:
    """``"*"``: any peer is the proxy, but an entry the client wrote before the proxy's
    own is not believed (the nearest entry names the client)."""
    chain = (b"x-forwarded-for", b"6.6.6.6, 5.5.5.5")
    assert TrustedProxies("*").client(scope("9.9.9.9", chain)) == "5.5.5.5"
    inner = TrustedProxies(["*", "5.5.5.0/24"])
    assert inner.client(scope("9.9.9.9", chain)) == "6.6.6.6"  # 5.5.5.5 named a proxy


@pytest.mark.parametrize(
    "make",
    [
        lambda bad: TrustedProxies(forwarded_header=bad),
        lambda bad: RateLimitMiddleware(
            app_with([]), RateLimit(MemoryBackend()), forwarded_header=bad
        ),
        lambda bad: RouteLimit(RateLimit(MemoryBackend()), "ip:1/m", forwarded_header=bad),
    ],
)
@pytest.mark.parametrize("bad", ["x-forwarded_for", "cf-connecting-ip", 3])
def test_a_header_this_package_does_not_read_is_refused_when_made(
    make: Callable[[object], object], bad: object
) -> None:
    with pytest.raises(ConfigurationError, match="'x-forwarded-for', 'forwarded', 'x-real-ip'"):
        make(bad)


async def test_a_client_written_forwarded_header_behind_a_proxy_is_ignored() -> None:
    app = app_with([Route("/x", "ip:5/m")], trusted_proxies=["10.0.0.0/8"])
    async with client(app) as http:
        proxy = {"x-forwarded-for": "1.1.1.1"}
        answers = [
            await http.get("/x", headers={"forwarded": f"for=2.2.2.{n}", **proxy})
            for n in range(20)
        ]
    assert statuses(answers) == [200] * 5 + [429] * 15


# --- item 2: no peer address (a unix socket) ---


@pytest.mark.parametrize("peer", [None, ""])
def test_no_peer_address_is_one_unknown_client_with_one_warning(
    peer: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    proxies = TrustedProxies(["10.0.0.0/8"])
    with caplog.at_level(logging.WARNING, "ratelimit.asgi"):
        answers = {proxies.client(scope(peer, XFF)) for _ in range(3)}
    assert answers == {"unknown"}
    assert len(caplog.records) == 1
    assert "trusted_proxies=['unix']" in caplog.text


@pytest.mark.parametrize("trusted", ["unix", "UNIX", "*"])
def test_a_trusted_unix_peer_names_the_client(
    trusted: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxies = TrustedProxies([trusted])
    assert proxies.client(scope(None, XFF)) == "1.1.1.1"
    assert proxies.client(scope(None, (b"x-forwarded-for", b"1.1.1.1, unix:"))) == "1.1.1.1"
    assert proxies.client(scope("10.0.0.1", XFF)) == ("1.1.1.1" if trusted == "*" else "10.0.0.1")
    with caplog.at_level(logging.WARNING, "ratelimit.asgi"):
        assert proxies.client(scope(None)) == "unknown"
        assert proxies.client(scope(None, FORWARDED)) == "unknown"
    assert len(caplog.records) == 1
    assert "sent no x-forwarded-for header" in caplog.text


async def test_the_middleware_limits_clients_it_cannot_name_together() -> None:
    app = app_with([Route("/x", "ip:5/m")])

    async def unix_socket(scope: Any, receive: Any, send: Any) -> None:
        await app({**scope, "client": None}, receive, send)

    async with client(unix_socket) as http:
        answers = [
            await http.get("/x", headers={"x-forwarded-for": f"1.1.1.{n}"}) for n in range(12)
        ]
    assert statuses(answers) == [200] * 5 + [429] * 7


# --- item 3: root_path ---


@pytest.mark.parametrize(
    ("root", "path"),
    [
        ("", "/ping"),
        ("/api", "/api/ping"),
        ("/api", "/api"),
        ("/api", "/api/"),
        ("/api", "/apiary/ping"),
        ("/api", "/ping"),  # a server that already stripped it
        ("/api/v1", "/api/v1/items/3"),
        ("/", "/x"),
    ],
)
def test_the_route_path_is_starlettes(root: str, path: str) -> None:
    scope = {"type": "http", "root_path": root, "path": path}
    assert route_path(scope) == get_route_path(scope)


async def test_routes_and_exclusions_match_without_root_path() -> None:
    routes = [Route("/ping", "ip:2/m"), Route("/*", "ip:1/m")]
    app = app_with(routes, exclude=["/health"])
    async with client(app, root_path="/api") as http:
        pings = [await http.get("/api/ping") for _ in range(3)]
        health = [await http.get("/api/health") for _ in range(3)]
    assert statuses(pings) == [200, 200, 429]
    assert pings[0].headers["ratelimit-policy"] == '"ip:2/m";q=2;w=60'
    assert statuses(health) == [200] * 3


# --- item 7: values read by type ---

SPELLINGS: list[object] = [
    7, 7.0, -0.0, 7.5, True, False, 1e20, math.inf, math.nan, None, [7], {"a": 1},
    "7", " 7", "7 ", "\t7\n", "07", "0007", "+7", "-7", "-0", "+ 7", "7_0", "1_000", "_7",
    "7_", "7__0", "7.0", "7.00", "+7.00", "7_0.0", "7.", ".0", "7.5", "7e0", "0x7", "0b1",
    "true", "x", "", "  ", "\u0667", "\uff17", "\u20057", "\xa07", "9007199254740993",
]  # fmt: skip


@pytest.mark.parametrize("value", SPELLINGS, ids=repr)
def test_type_int_reads_every_integer_pydantic_reads(value: object) -> None:
    """Whatever FastAPI's ``int`` accepts counts as that integer; what it refuses, we
    may read (Python's ``int()`` reads more) or refuse, never count apart."""
    try:
        expected = TypeAdapter(int).validate_python(value)
    except ValidationError:
        return
    assert to_int(value) == expected


@pytest.mark.parametrize("value", ["x", 7.5, "7.5", [7], {}, "0x7", "7.", "  ", math.nan])
def test_type_int_refuses_what_is_no_integer(value: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        to_int(value)


@pytest.mark.parametrize(
    "value", [True, False, 0, 1, 2, 0.0, 1.0, "true", "False", "YES", "no", "on", "off", "t",
              "f", "y", "n", "1", "0", " true ", "2", "maybe", "", None, [True]],
    ids=repr,
)  # fmt: skip
def test_type_bool_reads_every_boolean_pydantic_reads(value: object) -> None:
    try:
        expected = TypeAdapter(bool).validate_python(value)
    except ValidationError:
        return
    assert to_bool(value) is expected


def test_without_a_type_numbers_count_by_value() -> None:
    assert {as_text(v) for v in (7, 7.0, "7", 7e0, -0.0 + 7)} == {"7"}
    assert as_text(-0.0) == "0"
    assert as_text(7.5) == "7.5"
    assert as_text(True) == "true"
    assert as_text(False) == "false"
    assert as_text(" 7") == " 7"  # text stays text: only a type says it is a number
    assert as_text(None) is None


async def test_typed_sources_in_the_middleware() -> None:
    routes = [
        Route("/org", "org:2/m", org=query_param("org", type=int)),
        Route("/team/{team}", "team:2/m", team=path_param("team", type=int)),
        Route("/user", "who:2/m", who=header("x-user", type=str.lower)),
    ]
    async with client(app_with(routes)) as http:
        orgs = [await http.get(f"/org?org={spelling}") for spelling in ("7", "07", "+7", "7.0")]
        teams = [await http.get(f"/team/{spelling}") for spelling in ("3", "003", "3")]
        users = [await http.get("/user", headers={"x-user": who}) for who in ("Ann", "ANN", "ann")]
        bad = await http.get("/org?org=seven")
        empty = await http.get("/org?org=")
    assert statuses(orgs) == [200, 200, 429, 429]
    assert statuses(teams) == [200, 200, 429]
    assert statuses(users) == [200, 200, 429]
    assert bad.status_code == 422
    assert bad.headers["content-type"] == "application/problem+json"
    problem = bad.json()
    assert problem["status"] == 422
    assert problem["detail"].startswith("query_param('org', type=int): 'seven' is not an integer")
    assert "ratelimit" not in bad.headers
    assert empty.status_code == 200  # no value: the rule does not apply (as everywhere)


async def test_an_unreadable_value_refuses_a_websocket_handshake() -> None:
    app = app_with([Route("/ws", "org:2/m", org=query_param("org", type=int))])
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    handshake = {
        "type": "websocket", "path": "/ws", "query_string": b"org=x", "headers": [],
        "client": ("10.0.0.1", 1), "extensions": {"websocket.http.response": {}},
    }  # fmt: skip
    await app(handshake, receive, send)
    assert sent[0]["type"] == "websocket.http.response.start"
    assert sent[0]["status"] == 422
    assert json.loads(sent[1]["body"])["status"] == 422


async def test_route_limit_refuses_an_unreadable_value_with_or_without_the_middleware() -> None:
    rl = RateLimit(MemoryBackend())
    transfers = RouteLimit(rl, "account:1/m", account=json_field("account", type=int))

    async def endpoint(request: Request) -> PlainTextResponse:
        await transfers.check(request)
        return PlainTextResponse("ok")

    bare = Starlette(routes=[StarletteRoute("/t", endpoint, methods=["POST"])])
    wrapped = Starlette(routes=[StarletteRoute("/t", endpoint, methods=["POST"])])
    wrapped.add_middleware(RateLimitMiddleware, limiter=rl)
    for app in (bare, wrapped):
        async with client(app) as http:
            bad = await http.post("/t", json={"account": [1]})
        assert bad.status_code == 422
        assert "json_field('account', type=int)" in bad.text
    async with client(wrapped) as http:
        answers = [await http.post("/t", json={"account": a}) for a in (5, "5", 5.0)]
    assert statuses(answers) == [200, 429, 429]


def test_a_type_that_cannot_read_is_refused_when_made() -> None:
    with pytest.raises(TypeError, match="type= takes int, bool or a function"):
        json_field("account", type="int")
    assert repr(header("x-user", type=str.lower)) == "header('x-user', type=str.lower)"
    assert repr(json_field("a.b", type=int)) == "json_field('a.b', type=int)"
    error = SourceValueError("json_field('a', type=int)", "x" * 100, "an integer")
    assert len(str(error)) < 120


# --- found by review: values a client can spell twice, and quotes it can leave open ---


async def test_a_header_sent_twice_is_refused_not_counted_apart() -> None:
    """``X-API-Key: K`` and a second line ``X-API-Key: r<i>``: frameworks read one of them
    (Starlette the first, others the last or both joined), so counting the joined text gave
    every request a counter of its own. It is refused with 422, counted nowhere."""
    app = app_with([Route("/search", "apikey:3/h", apikey=header("X-API-Key"))])
    async with client(app) as http:
        twice = [
            await http.get("/search", headers=[("X-API-Key", "K"), ("X-API-Key", f"r{i}")])
            for i in range(10)
        ]
        once = [await http.get("/search", headers={"X-API-Key": "K"}) for _ in range(4)]
    assert statuses(twice) == [422] * 10
    assert "sent 2 times" in twice[0].json()["detail"]
    assert statuses(once) == [200, 200, 200, 429]  # K's counter untouched by the 422s


async def test_a_query_parameter_sent_twice_is_refused_not_counted_apart() -> None:
    """``?org=<i>&org=7``: Starlette and FastAPI read the last value, others the first; the
    limiter counted the first, so the endpoint served ``7`` through every refusal."""
    app = app_with([Route("/org", "org:3/h", org=query_param("org", type=int))])
    async with client(app) as http:
        twice = [await http.get(f"/org?org={100 + i}&org=7") for i in range(10)]
        once = [await http.get("/org?org=7") for _ in range(4)]
    assert statuses(twice) == [422] * 10
    assert statuses(once) == [200, 200, 200, 429]


@pytest.mark.parametrize("opened", ['for="x{i}', 'for="a\\{i}', 'for=1.1.1.1;ext="{i}'])
async def test_a_quote_a_client_leaves_open_hides_no_proxy_entry(opened: str) -> None:
    """A client's ``Forwarded`` with a quote left open, on the line the proxy appends its
    own entry to: the proxy's entry still names the client."""
    app = app_with(
        [Route("/ip", "ip:3/h")], trusted_proxies=["127.0.0.1"], forwarded_header="forwarded"
    )
    async with client(app, peer="127.0.0.1") as http:
        answers = [
            await http.get("/ip", headers={"Forwarded": opened.format(i=i) + ", for=198.51.100.7"})
            for i in range(10)
        ]
    assert statuses(answers) == [200, 200, 200] + [429] * 7


def test_a_trusted_proxy_connecting_over_ipv6_as_mapped_ipv4_is_trusted() -> None:
    proxies = TrustedProxies(["127.0.0.1"])
    xff = (b"x-forwarded-for", b"203.0.113.5")
    assert proxies.client(scope("::ffff:127.0.0.1", xff)) == "203.0.113.5"
    chain = (b"x-forwarded-for", b"1.2.3.4, ::ffff:127.0.0.1")  # an inner hop, mapped
    assert proxies.client(scope("127.0.0.1", chain)) == "1.2.3.4"


@pytest.mark.parametrize("route", ["route", "endpoint only", "neither"])
async def test_a_route_limits_key_never_follows_the_path_asked_for(route: str) -> None:
    """Starlette versions before ``scope["route"]`` give only ``scope["endpoint"]``; the
    key falls back to the endpoint, then to the rules, never to the path (a client varies
    ``/items/0`` ... ``/items/9`` at will)."""
    limit = RouteLimit(RateLimit(MemoryBackend()), "ip:3/h")

    async def items(request: Request) -> PlainTextResponse:
        if route != "route":
            request.scope.pop("route", None)
        if route == "neither":
            request.scope.pop("endpoint", None)
        await limit.check(request)
        return PlainTextResponse("ok")

    app = Starlette(routes=[StarletteRoute("/items/{item}", items)])
    async with client(app) as http:
        answers = []
        for i in range(10):
            try:
                answers.append((await http.get(f"/items/{i}")).status_code)
            except Exception as exc:  # HTTPException without the middleware
                answers.append(getattr(exc, "status_code", 500))
    assert answers == [200, 200, 200] + [429] * 7


async def test_a_route_limits_head_requests_count_as_get() -> None:
    """Starlette answers ``HEAD`` with the ``GET`` endpoint: counted under its own key, a
    client would get the limit twice (once by GET, once by HEAD)."""
    limit = RouteLimit(RateLimit(MemoryBackend()), "ip:2/h")

    async def page(request: Request) -> PlainTextResponse:
        await limit.check(request)
        return PlainTextResponse("page")

    app = Starlette(routes=[StarletteRoute("/page", page)])
    async with client(app) as http:
        answers = []
        for method in ("GET", "HEAD", "GET", "HEAD"):
            try:
                answers.append((await http.request(method, "/page")).status_code)
            except Exception as exc:  # HTTPException without the middleware
                answers.append(getattr(exc, "status_code", 500))
    assert answers == [200, 200, 429, 429]


async def test_route_limit_reads_json_nested_past_the_parser_as_no_value() -> None:
    """``[[[[...`` deeper than Python's parser goes is no value (the rule does not apply),
    not a 500 before the endpoint runs."""
    rl = RateLimit(MemoryBackend())
    login = RouteLimit(rl, "username:1/m", username=json_field("username"))

    async def endpoint(request: Request) -> PlainTextResponse:
        await login.check(request)
        return PlainTextResponse("ok")

    app = Starlette(routes=[StarletteRoute("/login", endpoint, methods=["POST"])])
    deep = "[" * 100_000
    async with client(app) as http:
        answers = [
            await http.post("/login", content=deep, headers={"content-type": "application/json"})
            for _ in range(2)
        ]
    assert statuses(answers) == [200, 200]
