"""The ASGI front end in process (httpx's ASGI transport, memory storage): configuration
checked when made, client addresses, sources, header fields, the refusal answers. The same
behaviour under a real uvicorn is in tests/test_http_server.py."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from http_sfv.list import List as SFList
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

from ratelimit import (
    ConfigurationError,
    MemoryBackend,
    RateLimit,
    Rule,
    RuleState,
    RuleSyntaxError,
)
from ratelimit.asgi import (
    RateLimitMiddleware,
    Route,
    RouteLimit,
    TrustedProxies,
    client_ip,
    header,
    json_field,
    path_param,
    query_param,
    user,
)
from ratelimit.asgi.headers import limit_field, policy_field, seconds
from ratelimit.core.decision import Decision
from tests.conftest import FailingBackend

pytestmark = pytest.mark.timeout(30)


def app_with(
    rl: RateLimit, routes: list[Route], endpoint: Callable[..., Any] | None = None, **options: Any
) -> Starlette:
    async def plain(request: Request) -> PlainTextResponse:
        if endpoint is not None:
            return await endpoint(request)  # type: ignore[no-any-return]
        return PlainTextResponse("ok")

    app = Starlette(routes=[StarletteRoute("/{path:path}", plain, methods=["GET", "POST"])])
    app.add_middleware(RateLimitMiddleware, limiter=rl, routes=routes, **options)
    return app


def client(app: Any, peer: str = "10.1.1.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 4000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


# --- configuration, checked when made ---


def test_a_bad_rule_fails_when_the_route_is_made() -> None:
    with pytest.raises(RuleSyntaxError):
        Route("/x", "5/fortnight")


def test_a_selector_without_a_source_is_named() -> None:
    with pytest.raises(ConfigurationError, match="select 'apikey' but no source was given"):
        Route("/x", "apikey:5/m")


def test_a_source_for_no_selector_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="apikey is not a selector of its rules"):
        Route("/x", "ip:5/m", apikey=header("x-api-key"))


def test_a_path_param_the_pattern_lacks_is_refused() -> None:
    with pytest.raises(ConfigurationError) as refused:
        Route("/items/{id}", "item:5/m", item=path_param("itm"))
    assert str(refused.value) == (
        "Route('/items/{id}'): item=path_param('itm') names no parameter of the route's "
        "pattern (its parameters: id), so it would never have a value"
    )
    with pytest.raises(ConfigurationError, match="did you mean path_param\\('item_id'\\)"):
        Route("/items/{item_id}", "item:5/m", item=path_param("itemid"))
    with pytest.raises(ConfigurationError, match="it has no parameter"):
        Route("/*", "item:5/m", item=path_param("id"))
    Route("/items/{id}/{rest:path}", "item:5/m & rest:9/m", item=path_param("id"),
          rest=path_param("rest"))  # fmt: skip


def test_the_middleware_never_reads_a_body() -> None:
    with pytest.raises(ConfigurationError, match="never buffers"):
        Route("/login", "username:3/m", username=json_field("username"))


@pytest.mark.parametrize(
    ("path", "message"),
    [("ping", "starts with '/'"), ("/a*/b", "may only end"), ("/a/{id", "malformed parameter")],
)
def test_bad_path_patterns_are_refused(path: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Route(path, "5/m")


def test_unknown_methods_and_bad_proxies_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="unknown method FETCH"):
        Route("/x", "5/m", methods=["fetch"])
    with pytest.raises(ConfigurationError, match="'10.0.0.300' is not an IP address"):
        TrustedProxies(["10.0.0.300"])
    with pytest.raises(ConfigurationError, match="ipv6_prefix"):
        TrustedProxies([], ipv6_prefix=0)


def test_a_cost_the_rules_cannot_admit_fails_at_start() -> None:
    rl = RateLimit(MemoryBackend())

    async def app(scope: Any, receive: Any, send: Any) -> None: ...

    with pytest.raises(ConfigurationError):
        RateLimitMiddleware(app, rl, [Route("/x", "2/m", cost=3)])
    with pytest.raises(ConfigurationError):
        RouteLimit(rl, "2/m", cost=3)


# --- routes and sources ---


async def test_first_matching_route_decides_and_path_params_select() -> None:
    rl = RateLimit(MemoryBackend())
    routes = [
        Route("/items/{item}", "item:1/m", methods=["GET"], item=path_param("item")),
        Route("/items/*", "100/m"),
    ]
    async with client(app_with(rl, routes)) as http:
        first = await http.get("/items/a")
        again = await http.get("/items/a")
        other = await http.get("/items/b")
        posted = await http.post("/items/a")  # not GET: the catch-all decides
    assert [first.status_code, again.status_code, other.status_code] == [200, 429, 200]
    assert posted.status_code == 200
    assert posted.headers["ratelimit-policy"] == '"100/m";q=100;w=60'


async def test_query_and_user_sources() -> None:
    class User:
        is_authenticated = True
        identity = "ann"

    rl = RateLimit(MemoryBackend())
    routes = [
        Route("/q", "org:1/m", org=query_param("org")),
        Route("/u", "who:1/m", who=user()),
    ]
    app = app_with(rl, routes)

    async def with_user(scope: Any, receive: Any, send: Any) -> None:
        await app({**scope, "user": User()}, receive, send)

    async with client(with_user) as http:
        assert [(await http.get("/q?org=x")).status_code for _ in range(2)] == [200, 429]
        assert (await http.get("/q?org=y")).status_code == 200
        assert [(await http.get("/u")).status_code for _ in range(2)] == [200, 429]


async def test_sources_of_one_request_are_read_once_each_in_order_async_ones_awaited() -> None:
    """A plain source, an async one, then a plain one (and a typed one after them): each
    read once, in the tree's order, the async one's value awaited, a typed value converted
    after it was awaited; the same values when every source is plain."""
    from ratelimit.asgi.request import HTTPRequest
    from ratelimit.asgi.sources import Source, resolve, resolve_now

    reads: list[str] = []

    def plain(name: str, value: object) -> Source:
        def read(request: object) -> object:
            reads.append(name)
            return value

        return Source(read, name)

    async def later(value: object) -> object:
        return value

    def awaited(name: str, value: object) -> Source:
        def read(request: object) -> object:
            reads.append(name)
            return later(value)

        return Source(read, name)

    request = HTTPRequest({"type": "http", "headers": []}, TrustedProxies())
    names = ("a", "b", "c", "d")
    mixed = {
        "a": plain("a", "ann"),
        "b": awaited("b", b"bytes"),
        "c": plain("c", 7),
        "d": header("x-n", type=int),
    }
    mixed["d"] = Source(awaited("d", "012").read, "d", convert=mixed["d"].convert, expected="int")
    read = resolve_now(names, mixed, request)
    assert read.__class__ is not tuple  # an awaitable, from the async source on
    assert await read == ("ann", "bytes", "7", "12")  # type: ignore[misc]
    assert reads == ["a", "b", "c", "d"]
    reads.clear()
    given = ("x", None, "", 3)
    every = {name: plain(name, value) for name, value in zip(names, given, strict=True)}
    assert resolve_now(names, every, request) == ("x", None, "", "3")  # no coroutine
    assert await resolve(names, every, request) == ("x", None, "", "3")
    assert reads == ["a", "b", "c", "d"] * 2


def test_client_addresses() -> None:
    def scope(peer: str | None, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
        return {"client": None if peer is None else (peer, 1), "headers": list(headers)}

    none = TrustedProxies()
    assert none.client(scope("10.0.0.1", (b"x-forwarded-for", b"1.2.3.4"))) == "10.0.0.1"
    assert none.client(scope(None)) == "unknown"  # a unix socket: one shared client
    proxies = TrustedProxies(["10.0.0.0/8"])
    xff = (b"x-forwarded-for", b"6.6.6.6, 1.2.3.4, 10.0.0.7")
    assert proxies.client(scope("10.0.0.1", xff)) == "1.2.3.4"  # rightmost not trusted
    assert proxies.client(scope("8.8.8.8", xff)) == "8.8.8.8"  # peer not a proxy
    forwarded = (b"forwarded", b'for=6.6.6.6, for="[2001:db8::1]:4711";proto=https')
    assert proxies.client(scope("10.0.0.1", forwarded)) == "10.0.0.1"  # not its header
    rfc7239 = TrustedProxies(["10.0.0.0/8"], forwarded_header="forwarded")
    assert rfc7239.client(scope("10.0.0.1", forwarded)) == "2001:db8::/64"
    assert TrustedProxies(ipv6_prefix=128).client(scope("2001:db8::1")) == "2001:db8::1"
    assert none.client(scope("::ffff:1.2.3.4")) == "1.2.3.4"
    assert TrustedProxies("*").client(scope("9.9.9.9", (b"x-forwarded-for", b"5.5.5.5"))) == (
        "5.5.5.5"
    )


# --- header fields ---


def test_fields_are_structured_field_lists() -> None:
    states = [
        RuleState(Rule.parse("ip:5/m"), 0, False, 3, 41.2),
        RuleState(Rule.parse("10/500ms"), 1, True, 0, 0.3),
        RuleState(Rule.parse("10/s burst 20"), 2, False, 17, 0.1),
        RuleState(Rule.parse("10/s burst 15"), 3, False, 12, 0.1),
    ]
    policy = SFList()
    policy.parse(policy_field(states).encode())
    assert [(i.value, dict(i.params)) for i in policy] == [
        ("ip:5/m", {"q": 5, "w": 60}),
        ("10/500ms", {"q": 10}),  # no whole-second window to state
        ("10/s burst 20", {"q": 20, "w": 2}),  # GCRA: the burst, refilled in 2 s
        ("10/s burst 15", {"q": 15}),  # refilled in 1.5 s
    ]
    limits = SFList()
    limits.parse(limit_field(states).encode())
    assert [(i.value, dict(i.params)) for i in limits] == [
        ("ip:5/m", {"r": 3, "t": 42}),
        ("10/500ms", {"r": 0, "t": 1}),
        ("10/s burst 20", {"r": 17, "t": 1}),
        ("10/s burst 15", {"r": 12, "t": 1}),
    ]
    assert seconds(3.0000000001) == 3
    assert seconds(0) == 0


# --- answers ---


async def test_storage_failure_fail_open_and_deny() -> None:
    opened = RateLimit(FailingBackend(), on_error="allow")
    async with client(app_with(opened, [Route("/x", "ip:1/m")])) as http:
        answers = [await http.get("/x") for _ in range(3)]
    assert [a.status_code for a in answers] == [200] * 3
    denied = RateLimit(FailingBackend(), on_error="deny")
    async with client(app_with(denied, [Route("/x", "ip:1/m")])) as http:
        refused = await http.get("/x")
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["status"] == 503
    assert int(refused.headers["retry-after"]) >= 1


async def test_a_response_of_ones_own_for_refusals() -> None:
    rl = RateLimit(MemoryBackend())

    def refused(request: Any, decision: Decision) -> PlainTextResponse:
        return PlainTextResponse(f"slow down, {request.client_ip}", status_code=429)

    app = app_with(rl, [Route("/x", "ip:1/m")], refused=refused)
    async with client(app) as http:
        await http.get("/x")
        answer = await http.get("/x")
    assert answer.status_code == 429
    assert answer.text == "slow down, 10.1.1.1"
    assert int(answer.headers["retry-after"]) >= 1
    assert answer.headers["ratelimit"].startswith('"ip:1/m";r=0')


async def test_a_refusal_raised_inside_the_app_becomes_the_429() -> None:
    """A @rl.limit function the endpoint calls refuses: the middleware answers for it."""
    rl = RateLimit(MemoryBackend())

    @rl.limit("1/m", key="inner")
    async def inner() -> str:
        return "ok"

    async def endpoint(request: Request) -> PlainTextResponse:
        return PlainTextResponse(await inner())

    async with client(app_with(rl, [], endpoint)) as http:
        first = await http.get("/any")
        second = await http.get("/any")
    assert first.status_code == 200
    assert second.status_code == 429
    assert second.json()["violated-policies"] == ["1/m"]
    assert second.headers["ratelimit"].startswith('"1/m";r=0')


async def test_route_limit_without_the_middleware(caplog: pytest.LogCaptureFixture) -> None:
    """Without the middleware a refusal is Starlette's HTTPException (never a 500), and a
    warning says admitted responses go without headers."""
    rl = RateLimit(MemoryBackend())
    login = RouteLimit(rl, "username:1/m", username=json_field("username"))

    async def endpoint(request: Request) -> PlainTextResponse:
        decision = await login.check(request)
        assert request.state.ratelimit is decision
        return PlainTextResponse("welcome")

    app = Starlette(routes=[StarletteRoute("/login", endpoint, methods=["POST"])])
    with caplog.at_level(logging.WARNING, "ratelimit.asgi"):
        async with client(app) as http:
            first = await http.post("/login", json={"username": "ann"})
            second = await http.post("/login", json={"username": "ann"})
            junk = await http.post("/login", content=b"not json")
    assert first.status_code == 200
    assert second.status_code == 429
    assert int(second.headers["retry-after"]) >= 1
    assert second.headers["ratelimit"].startswith('"username:1/m";r=0')
    assert junk.status_code == 200  # no username: the rule does not apply
    assert "without RateLimitMiddleware" in caplog.text


async def test_routes_with_one_key_share_a_cap_across_paths() -> None:
    """The README's recipe: 'ip' counts per route, 'site' across both routes."""
    rl = RateLimit(MemoryBackend())
    site = client_ip()
    routes = [
        Route("/login", "ip:2/m | site:4/m", key="site", site=site),
        Route("/*", "site:4/m", key="site", site=site),
    ]
    async with client(app_with(rl, routes)) as http:
        logins = [(await http.post("/login")).status_code for _ in range(3)]
        others = [(await http.get(f"/page/{n}")).status_code for n in range(3)]
    assert logins == [200, 200, 429]  # the login route's own 2/m
    assert others == [200, 200, 429]  # 2 logins + 2 pages reach the shared 4/m


async def test_a_route_and_a_route_limit_on_one_endpoint_keep_counters_of_their_own() -> None:
    """Both count ``ip`` for ``GET /page``: on one counter each request counted twice, and
    the route limit's 3/m refused the second request."""
    rl = RateLimit(MemoryBackend())
    limit = RouteLimit(rl, "ip:3/m")

    async def page(request: Request) -> PlainTextResponse:
        await limit(request)
        return PlainTextResponse("ok")

    app = Starlette(routes=[StarletteRoute("/page", page)])
    app.add_middleware(
        RateLimitMiddleware, limiter=rl, routes=[Route("/page", "ip:10/m", methods=["GET"])]
    )
    async with client(app) as http:
        answers = [(await http.get("/page")).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]  # the route limit's own 3/m


async def test_head_counts_as_the_get_it_runs() -> None:
    rl = RateLimit(MemoryBackend())
    async with client(app_with(rl, [Route("/page", "ip:2/m", methods=["GET"])])) as http:
        answers = [await http.head("/page"), await http.get("/page"), await http.head("/page")]
    assert [a.status_code for a in answers] == [200, 200, 429]
