"""The ASGI front end under a real uvicorn process, driven by httpx over TCP: a Starlette
and a FastAPI application (tests/http_apps.py), counters in a real Redis.

Each test speaks for clients of its own: the servers trust 127.0.0.1 as a proxy, so an
``X-Forwarded-For`` address names the client (except where a test checks that an untrusted
one is ignored).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from http_sfv.list import List as SFList

from ratelimit import Rule
from ratelimit.rules.tree import to_tree
from tests.http_server import UvicornServer
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

APPS = {
    "starlette": "tests.http_apps:starlette_app",
    "fastapi": "tests.http_apps:fastapi_app",
}
_clients = itertools.count(1)


def new_client() -> dict[str, str]:
    """Headers naming a client nobody else in this run uses (via the trusted proxy)."""
    n = next(_clients)
    return {"x-forwarded-for": f"198.51.{n // 250}.{n % 250 + 1}"}


def sf_list(value: str) -> list[tuple[str, dict[str, Any]]]:
    """A Structured Fields list, parsed strictly: (item, parameters) each."""
    parsed = SFList()
    parsed.parse(value.encode("ascii"))
    return [(item.value, dict(item.params)) for item in parsed]


@pytest.fixture(scope="module", params=sorted(APPS))
def server(request: pytest.FixtureRequest, redis_url: str) -> Iterator[UvicornServer]:
    env = {"RL_TEST_STORAGE": redis_url, "RL_TEST_TRUSTED": "127.0.0.1"}
    with UvicornServer(APPS[request.param], env, factory=True) as running:
        yield running


def check_headers(response: httpx.Response, rules: str) -> dict[str, dict[str, Any]]:
    """``RateLimit-Policy`` and ``RateLimit`` name every rule of ``rules`` once, with its
    quota and window; returns the ``RateLimit`` parameters by policy name."""
    expected = [str(rule) for rule in _leaves(rules)]
    policy = sf_list(response.headers["ratelimit-policy"])
    assert [name for name, _ in policy] == expected
    for (name, params), rule in zip(policy, _leaves(rules), strict=True):
        assert params == {"q": rule.count, "w": rule.span_ms // 1000}, name
    limits = sf_list(response.headers["ratelimit"])
    assert [name for name, _ in limits] == expected
    for name, params in limits:
        assert set(params) == {"r", "t"}, name
        assert isinstance(params["r"], int), name
        assert isinstance(params["t"], int), name
        assert params["r"] >= 0, name
        assert params["t"] >= 0, name
    return dict(limits)


def _leaves(rules: str) -> list[Rule]:
    from ratelimit.core.plan import compile_tree

    return list(compile_tree(to_tree(rules)).rules)


async def test_headers_count_down_and_the_refusal_helps(server: UvicornServer) -> None:
    client = new_client()
    async with httpx.AsyncClient(base_url=server.url, headers=client) as http:
        for n in range(5):
            response = await http.get("/ping")
            assert response.status_code == 200
            limits = check_headers(response, "ip:5/m")
            assert limits["ip:5/m"]["r"] == 4 - n
            assert 0 < limits["ip:5/m"]["t"] <= 60
            assert response.headers["x-ratelimit-limit"] == "5"
            assert response.headers["x-ratelimit-remaining"] == str(4 - n)
        refused = await http.get("/ping")
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/problem+json"
    retry = int(refused.headers["retry-after"])
    assert 0 < retry <= 60
    limits = check_headers(refused, "ip:5/m")
    assert limits["ip:5/m"] == {"r": 0, "t": retry}
    problem = refused.json()
    assert problem["status"] == 429
    assert problem["type"].endswith("#quota-exceeded")
    assert problem["violated-policies"] == ["ip:5/m"]


async def test_one_item_per_rule_of_the_tree(server: UvicornServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=new_client()) as http:
        responses = [await http.get("/tree") for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    limits = check_headers(responses[2], "ip:3/m | ip:10/h | 1000/d")
    assert limits["ip:3/m"]["r"] == 0
    assert limits["ip:10/h"]["r"] == 7
    refused = check_headers(responses[3], "ip:3/m | ip:10/h | 1000/d")
    assert refused["ip:3/m"]["r"] == 0
    assert refused["ip:10/h"]["r"] == 7  # a refused request counts nothing
    assert responses[3].json()["violated-policies"] == ["ip:3/m"]


async def test_a_header_selects_and_no_header_is_no_limit(server: UvicornServer) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        key = {"x-api-key": f"key-{next(_clients)}"}
        statuses = [(await http.get("/search", headers=key)).status_code for _ in range(11)]
        assert statuses == [200] * 10 + [429]
        other = await http.get("/search", headers={"x-api-key": f"key-{next(_clients)}"})
        assert other.status_code == 200
        bare = await http.get("/search")
    assert bare.status_code == 200
    assert "ratelimit" not in bare.headers  # no rule applied: nothing to report


async def test_login_limited_per_username_from_the_json_body(server: UvicornServer) -> None:
    user = f"user-{next(_clients)}"
    async with httpx.AsyncClient(base_url=server.url, headers=new_client()) as http:
        answers = [await http.post("/login", json={"username": user}) for _ in range(4)]
        other = await http.post("/login", json={"username": user + "-other"})
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert [a.json()["left"] for a in answers[:3]] == [2, 1, 0]
    assert check_headers(answers[0], "username:3/m")["username:3/m"]["r"] == 2
    assert answers[3].headers["content-type"] == "application/problem+json"
    assert answers[3].json()["violated-policies"] == ["username:3/m"]
    assert int(answers[3].headers["retry-after"]) >= 1
    assert other.status_code == 200


async def test_excluded_and_unmatched_paths_never_touch_the_limiter(
    server: UvicornServer,
) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=new_client()) as http:
        for path in ("/health", "/other"):
            answers = [await http.get(path) for _ in range(20)]
            assert {a.status_code for a in answers} == {200}
            assert all("ratelimit" not in a.headers for a in answers)


async def test_shadow_route_reports_but_never_refuses(server: UvicornServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=new_client()) as http:
        answers = [await http.get("/shadow") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert check_headers(answers[0], "ip:1/m")["ip:1/m"]["r"] == 0
    later = check_headers(answers[2], "ip:1/m")["ip:1/m"]
    assert later["r"] == 0
    assert later["t"] > 0  # the would-be refusal: nothing left until the first hit leaves
    assert "retry-after" not in answers[2].headers


async def test_a_streaming_response_passes_through_unbuffered(server: UvicornServer) -> None:
    """The endpoint sends its first chunk, then waits for /release: a middleware that
    buffered the body would hold that chunk until the end, and this read would time out."""
    async with (
        httpx.AsyncClient(base_url=server.url, headers=new_client(), timeout=30) as http,
        http.stream("GET", "/stream") as response,
    ):
        assert response.status_code == 200
        assert "ratelimit" in response.headers
        chunks = response.aiter_raw()
        first = await asyncio.wait_for(anext(chunks), 20)
        assert first == b"first\n"
        assert (await http.get("/release")).status_code == 200
        rest = b"".join([chunk async for chunk in chunks])
    assert rest == b"second\n"


@pytest.mark.parametrize("path", ["/ws", "/ws-inner"])
async def test_a_websocket_is_refused_at_connect(server: UvicornServer, path: str) -> None:
    """By the middleware's route (/ws), or by a RouteLimit the endpoint checks before it
    accepts (/ws-inner): either way the handshake gets the 429."""
    url = server.url.replace("http://", "ws://") + path
    client = new_client()
    async with websockets.connect(url, additional_headers=client) as socket:
        await socket.send("hello")
        assert await socket.recv() == "hello"
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(url, additional_headers=client):
            pass
    response = refused.value.response
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1
    assert sf_list(response.headers["ratelimit"])[0][0] == "ip:1/m"
    assert json.loads(response.body)["violated-policies"] == ["ip:1/m"]


@pytest.mark.parametrize("app", sorted(APPS))
def test_forwarded_for_counts_only_from_trusted_proxies(app: str, redis_url: str) -> None:
    """Without trusted proxies a client cannot spoof its way to fresh quota; with the proxy
    trusted, each forwarded address is a client of its own."""
    env = {"RL_TEST_STORAGE": redis_url}
    with UvicornServer(APPS[app], env, factory=True) as untrusting:
        spoofed = [
            httpx.get(untrusting.url + "/ping", headers={"x-forwarded-for": f"203.0.113.{n}"})
            for n in range(7)
        ]
        forwarded = httpx.get(untrusting.url + "/ping", headers={"forwarded": "for=192.0.2.9"})
    assert [r.status_code for r in spoofed] == [200] * 5 + [429] * 2
    assert forwarded.status_code == 429
    env["RL_TEST_TRUSTED"] = "127.0.0.1"
    with UvicornServer(APPS[app], env, factory=True) as trusting:
        honoured = [
            httpx.get(trusting.url + "/ping", headers={"x-forwarded-for": f"203.0.113.{n}"})
            for n in range(7)
        ]
        # what a client wrote before the proxy's own entry is not believed
        chained = [
            httpx.get(
                trusting.url + "/ping", headers={"x-forwarded-for": f"10.9.9.{n}, 203.0.113.50"}
            )
            for n in range(6)
        ]
    assert [r.status_code for r in honoured] == [200] * 7
    assert [r.status_code for r in chained] == [200] * 5 + [429]


@pytest.mark.long
@pytest.mark.parametrize(
    ("app", "on_error"), [("starlette", "allow"), ("fastapi", "allow"), ("fastapi", "deny")]
)
def test_redis_killed_mid_traffic(app: str, on_error: str) -> None:
    """Fail-open answers the routes (never a 500); on_error="deny" answers 503 with a
    Retry-After; /health is untouched either way; decisions come back with Redis."""
    with RedisServer() as redis:
        env = {
            "RL_TEST_STORAGE": redis.url,
            "RL_TEST_TRUSTED": "127.0.0.1",
            "RL_TEST_ON_ERROR": on_error,
        }
        with UvicornServer(APPS[app], env, factory=True) as server:
            client = new_client()
            with httpx.Client(base_url=server.url, headers=client, timeout=10) as http:
                before = [http.get("/ping").status_code for _ in range(3)]
                redis.stop()
                during = [http.get("/ping") for _ in range(4)]
                logins = [http.post("/login", json={"username": "ann"}) for _ in range(4)]
                health = [http.get("/health").status_code for _ in range(3)]
                redis.start()
                after = http.get("/ping")
    assert before == [200, 200, 200]
    assert health == [200, 200, 200]
    if on_error == "allow":
        assert [r.status_code for r in during] == [200] * 4
        assert [r.status_code for r in logins] == [200] * 4
        assert all("ratelimit" not in r.headers for r in during)  # nothing was counted
    else:
        for answer in [*during, *logins]:
            assert answer.status_code == 503
            assert answer.headers["content-type"] == "application/problem+json"
            assert int(answer.headers["retry-after"]) >= 1
    # the restarted server is empty: the count starts again
    assert after.status_code == 200
    assert check_headers(after, "ip:5/m")["ip:5/m"]["r"] == 4


def test_retry_after_is_never_below_the_refusing_rules_window(server: UvicornServer) -> None:
    """Retry-After (rounded up) reaches at least to every limited rule's t."""
    with httpx.Client(base_url=server.url, headers=new_client()) as http:
        for _ in range(3):
            http.get("/tree")
        refused = http.get("/tree")
    assert refused.status_code == 429
    limits = check_headers(refused, "ip:3/m | ip:10/h | 1000/d")
    assert int(refused.headers["retry-after"]) >= limits["ip:3/m"]["t"]
    assert math.isfinite(float(refused.headers["retry-after"]))


def test_the_web_example_under_uvicorn() -> None:
    """examples/web_app.py as its docstring runs it, on a real Redis killed near the end."""
    with (
        RedisServer() as redis,
        UvicornServer("examples.web_app:app", {"REDIS_URL": redis.url}) as server,
        httpx.Client(base_url=server.url, timeout=10) as http,
    ):
        pings = [http.get("/ping") for _ in range(6)]
        spoofed = http.get("/ping", headers={"x-forwarded-for": "203.0.113.7"})
        logins = [http.post("/login", json={"username": "ann"}) for _ in range(4)]
        bob = http.post("/login", json={"username": "bob"})
        searches = [http.get("/search", headers={"x-api-key": "k1"}) for _ in range(11)]
        other_key = http.get("/search", headers={"x-api-key": "k2"})
        health = [http.get("/health") for _ in range(20)]
        redis.stop()
        # (/ping stays refused from the denial cache: that refusal still stands)
        degraded = [
            http.get("/search", headers={"x-api-key": "k3"}),
            http.post("/login", json={"username": "zed"}),
        ]
        health_after = http.get("/health")
    assert [p.status_code for p in pings] == [200] * 5 + [429]
    assert spoofed.status_code == 429  # no trusted proxies: the header changes nothing
    assert [r.status_code for r in logins] == [200, 200, 200, 429]
    assert bob.status_code == 200
    assert [s.status_code for s in searches] == [200] * 10 + [429]
    assert other_key.status_code == 200
    assert {h.status_code for h in health} == {200}
    assert all("ratelimit" not in h.headers for h in health)
    for answer in (pings[5], logins[3], searches[10]):
        assert answer.headers["content-type"] == "application/problem+json"
        assert int(answer.headers["retry-after"]) >= 1
        assert "ratelimit-policy" in answer.headers
    assert [d.status_code for d in degraded] == [200, 200]  # fail-open: never a 500
    assert health_after.status_code == 200
