"""The WSGI front end (``ratelimit.wsgi``): a real ``wsgiref`` server in a thread (threads
per request), driven by httpx over TCP, and environ-level calls where simpler; memory
storage, and a real Redis for exact admission under concurrent requests. The same
behaviour as the ASGI middleware's (tests/test_asgi.py)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment
from wsgiref.util import setup_testing_defaults

import httpx
import pytest
from http_sfv.list import List as SFList

from ratelimit import ConfigurationError, MemoryBackend
from ratelimit import RateLimit as AsyncRateLimit
from ratelimit.core.decision import Decision
from ratelimit.sync import RateLimit
from ratelimit.wsgi import (
    HTTPRequest,
    RateLimitMiddleware,
    Route,
    header,
    path_param,
    query_param,
    scope_of,
    user,
)
from tests.conftest import FailingBackend

pytestmark = pytest.mark.timeout(30)


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 64  # 20 clients connecting at once: none waits for a SYN retry


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None: ...


@contextmanager
def serving(app: WSGIApplication) -> Iterator[httpx.Client]:
    """``app`` served on 127.0.0.1 (a port of its own) and a client for it."""
    server = make_server("127.0.0.1", 0, app, ThreadingServer, QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}", timeout=10) as http:
            yield http
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def ok(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


@pytest.fixture
def rl() -> Iterator[RateLimit]:
    limiter = RateLimit(MemoryBackend())
    yield limiter
    limiter.close()


def sf_list(value: str) -> dict[str, dict[str, Any]]:
    """A Structured Fields list, parsed strictly: parameters by item."""
    parsed = SFList()
    parsed.parse(value.encode("ascii"))
    return {str(item.value): dict(item.params) for item in parsed}


def call(app: WSGIApplication, path: str, method: str = "GET", **extra: Any) -> tuple[str, Any]:
    """One environ-level request: the status line, the headers (lower-case names) and body."""
    environ: dict[str, Any] = {"REQUEST_METHOD": method, "PATH_INFO": path, **extra}
    setup_testing_defaults(environ)
    started: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started.update(status=status, headers={k.lower(): v for k, v in headers})
        return lambda data: None

    result = app(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        getattr(result, "close", lambda: None)()
    return started["status"], {**started["headers"], "body": body}


# --- configuration, checked when made ---


def test_bad_configuration_fails_when_made(rl: RateLimit) -> None:
    with pytest.raises(TypeError, match=r"ratelimit\.sync\.RateLimit.*asgi"):
        RateLimitMiddleware(ok, AsyncRateLimit(MemoryBackend()))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Route objects"):
        RateLimitMiddleware(ok, rl, ["/x"])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError):
        RateLimitMiddleware(ok, rl, [Route("/x", "2/m", cost=3)])  # a cost 2/m cannot admit
    with pytest.raises(ConfigurationError, match="starts with '/'"):
        RateLimitMiddleware(ok, rl, exclude=["health"])
    with pytest.raises(ConfigurationError, match="is not an IP address"):
        RateLimitMiddleware(ok, rl, trusted_proxies=["10.0.0.300"])
    with pytest.raises(ConfigurationError, match="forwarded_header"):
        RateLimitMiddleware(ok, rl, forwarded_header="x-client-ip")
    with pytest.raises(TypeError, match="WSGI application"):
        RateLimitMiddleware("app", rl)  # type: ignore[arg-type]


def test_the_application_finds_its_routes_decision_in_the_environ(rl: RateLimit) -> None:
    """The environ keys are what applications read (``ratelimit.decision``, the route's
    decision; ``ratelimit.decisions``, every one made): spelt out here, not imported, so
    that a key renamed by mistake fails (the folders' move once renamed the first)."""
    seen: dict[str, Any] = {}

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        seen.update(environ)
        return ok(environ, start_response)

    limited = RateLimitMiddleware(app, rl, [Route("/search", "ip:5/m")])
    status, _ = call(limited, "/search")
    assert status.startswith("200")
    decision = seen["ratelimit.decision"]
    assert isinstance(decision, Decision)
    assert decision.remaining == 4
    assert seen["ratelimit.decisions"] == [decision]


# --- over TCP ---


def test_a_login_route_refuses_the_sixth_with_headers_and_problem(rl: RateLimit) -> None:
    app = RateLimitMiddleware(ok, rl, [Route("/login", "ip:5/m", methods=["POST"])])
    with serving(app) as http:
        for n in range(5):
            admitted = http.post("/login")
            assert admitted.status_code == 200
            assert sf_list(admitted.headers["ratelimit-policy"]) == {"ip:5/m": {"q": 5, "w": 60}}
            limits = sf_list(admitted.headers["ratelimit"])["ip:5/m"]
            assert limits["r"] == 4 - n
            assert 0 < limits["t"] <= 60
        refused = http.post("/login")
        read = http.get("/login")  # another method: no route decides
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/problem+json"
    retry = int(refused.headers["retry-after"])
    assert 0 < retry <= 60
    assert sf_list(refused.headers["ratelimit"]) == {"ip:5/m": {"r": 0, "t": retry}}
    problem = refused.json()
    assert problem["status"] == 429
    assert problem["type"].endswith("#quota-exceeded")
    assert problem["violated-policies"] == ["ip:5/m"]
    assert read.status_code == 200
    assert "ratelimit" not in read.headers


def test_excluded_paths_and_the_first_matching_route(rl: RateLimit) -> None:
    routes = [
        Route("/items/{item}", "item:1/m", methods=["GET"], item=path_param("item")),
        Route("/*", "ip:2/m"),
    ]
    app = RateLimitMiddleware(ok, rl, routes, exclude=["/health"])
    with serving(app) as http:
        health = [http.get("/health") for _ in range(4)]
        items = [http.get(p).status_code for p in ("/items/a", "/items/a", "/items/b")]
        posted = http.post("/items/a")  # not GET: the catch-all decides
    assert [r.status_code for r in health] == [200] * 4
    assert all("ratelimit" not in r.headers for r in health)
    assert items == [200, 429, 200]
    assert posted.status_code == 200
    assert posted.headers["ratelimit-policy"] == '"ip:2/m";q=2;w=60'


def test_header_and_query_sources(rl: RateLimit) -> None:
    routes = [
        Route("/search", "apikey:2/m", apikey=header("X-Api-Key")),
        Route("/q", "org:1/m", org=query_param("org", type=int)),
    ]
    with serving(RateLimitMiddleware(ok, rl, routes)) as http:
        keyed = [http.get("/search", headers={"x-api-key": "k1"}).status_code for _ in range(3)]
        other = http.get("/search", headers={"x-api-key": "k2"}).status_code
        unkeyed = [http.get("/search").status_code for _ in range(3)]  # the rule does not apply
        orgs = [http.get(f"/q?org={org}").status_code for org in ("7", "07", "8")]
        junk = http.get("/q?org=x")
    assert keyed == [200, 200, 429]
    assert other == 200
    assert unkeyed == [200] * 3
    assert orgs == [200, 429, 200]  # 07 is 7
    assert junk.status_code == 422
    assert junk.headers["content-type"] == "application/problem+json"


def test_a_forwarded_address_counts_only_from_a_trusted_proxy(rl: RateLimit) -> None:
    route = [Route("/x", "ip:1/m", key="spoof")]
    spoofed = RateLimitMiddleware(ok, rl, route)
    with serving(spoofed) as http:
        answers = [
            http.get("/x", headers={"x-forwarded-for": f"203.0.113.{n}"}).status_code
            for n in range(3)
        ]
    assert answers == [200, 429, 429]  # the peer, 127.0.0.1, whatever the header says
    trusted = RateLimitMiddleware(ok, rl, [Route("/y", "ip:1/m")], trusted_proxies=["127.0.0.1"])
    with serving(trusted) as http:
        ann = [http.get("/y", headers={"x-forwarded-for": "6.6.6.6, 198.51.100.1"}) for _ in "ab"]
        bob = http.get("/y", headers={"x-forwarded-for": "198.51.100.2"})
    assert [r.status_code for r in ann] == [200, 429]
    assert bob.status_code == 200


def test_shadow_mode_lets_through_with_headers(rl: RateLimit) -> None:
    app = RateLimitMiddleware(ok, rl, [Route("/x", "ip:1/m", shadow=True)])
    with serving(app) as http:
        answers = [http.get("/x") for _ in range(3)]
    assert [a.status_code for a in answers] == [200] * 3
    assert sf_list(answers[2].headers["ratelimit"])["ip:1/m"]["r"] == 0


def test_storage_failure_fail_open_and_deny() -> None:
    opened = RateLimit(FailingBackend(), on_error="allow")
    with opened, serving(RateLimitMiddleware(ok, opened, [Route("/x", "ip:1/m")])) as http:
        answers = [http.get("/x").status_code for _ in range(3)]
    assert answers == [200] * 3
    denied = RateLimit(FailingBackend(), on_error="deny")
    with denied, serving(RateLimitMiddleware(ok, denied, [Route("/x", "ip:1/m")])) as http:
        refused = http.get("/x")
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["status"] == 503
    assert int(refused.headers["retry-after"]) >= 1


def test_a_refusal_raised_inside_the_app_becomes_the_429(rl: RateLimit) -> None:
    """A ``@rl.limit`` function the view calls refuses: the middleware answers for it."""

    @rl.limit("1/m", key="inner")
    def inner() -> bytes:
        return b"ok"

    def view(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        body = inner()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [body]

    with serving(RateLimitMiddleware(view, rl)) as http:
        first = http.get("/any")
        second = http.get("/any")
    assert first.status_code == 200
    assert second.status_code == 429
    assert second.json()["violated-policies"] == ["1/m"]
    assert second.headers["ratelimit"].startswith('"1/m";r=0')


@pytest.mark.parametrize("store", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_exactly_the_limit_is_admitted_under_concurrent_requests(
    store: str, request: pytest.FixtureRequest
) -> None:
    url = "memory://" if store == "memory" else request.getfixturevalue("redis_url")
    with RateLimit.from_url(url, namespace=f"wsgi-{uuid.uuid4().hex[:12]}") as limiter:
        app = RateLimitMiddleware(ok, limiter, [Route("/x", "ip:3/m")])
        with serving(app) as http:
            start = threading.Barrier(20)
            statuses: list[int] = []

            def client() -> None:
                start.wait(10)
                statuses.append(http.get("/x").status_code)

            threads = [threading.Thread(target=client) for _ in range(20)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(20)
    assert sorted(statuses) == [200] * 3 + [429] * 17


# --- environ level ---


def test_the_environ_as_the_sources_read_it() -> None:
    scope = scope_of(
        {
            "REQUEST_METHOD": "post",
            "SCRIPT_NAME": "/api",
            "PATH_INFO": "/caf\xc3\xa9",  # UTF-8 bytes read as latin-1, as WSGI gives them
            "QUERY_STRING": "org=7&org=8",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": "",
            "HTTP_X_API_KEY": "k1",
            "REMOTE_ADDR": "10.0.0.1",
            "REMOTE_PORT": "4711",
            "REMOTE_USER": "ann",
        }
    )
    request = HTTPRequest(scope)
    assert (request.method, request.path, request.route_path) == ("POST", "/api/café", "/café")
    assert request.headers == {"content-type": "application/json", "x-api-key": "k1"}
    assert request.query_values("org") == ["7", "8"]
    assert request.client_ip == "10.0.0.1"
    assert scope["client"] == ("10.0.0.1", 4711)
    assert request.user == "ann"
    assert HTTPRequest(scope_of({"PATH_INFO": "/"})).client_ip == "unknown"  # no address


def test_routes_match_the_path_without_script_name(rl: RateLimit) -> None:
    app = RateLimitMiddleware(ok, rl, [Route("/who", "who:1/m", who=user())])
    mounted = {"SCRIPT_NAME": "/api", "REMOTE_USER": "ann"}
    assert call(app, "/who", **mounted)[0].startswith("200")
    assert call(app, "/who", **mounted)[0].startswith("429")
    assert call(app, "/who", **{**mounted, "REMOTE_USER": "bob"})[0].startswith("200")


def test_a_refusal_while_the_body_is_produced_replaces_the_response(rl: RateLimit) -> None:
    """A generator application that refuses after ``start_response`` but before its first
    chunk: its response is replaced (``exc_info``), and what it holds is closed."""
    inner = rl.limit("1/m", key="streamed")
    closed: list[bool] = []

    def streaming(environ: WSGIEnvironment, start_response: StartResponse) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        try:
            with inner:
                yield b"first"
            yield b"second"
        finally:
            closed.append(True)

    app = RateLimitMiddleware(streaming, rl)
    status, first = call(app, "/s")
    assert (status, first["body"]) == ("200 OK", b"firstsecond")
    status, refused = call(app, "/s")
    assert status == "429 Too Many Requests"
    assert json.loads(refused["body"])["violated-policies"] == ["1/m"]
    assert refused["ratelimit"].startswith('"1/m";r=0')
    assert closed == [True, True]


def test_settle_from_the_response_header(rl: RateLimit) -> None:
    def costly(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", [("X-Cost", "5")])
        return [b"done"]

    app = RateLimitMiddleware(costly, rl, [Route("/work", "ip:10/m", settle="x-cost")])
    first = call(app, "/work")[1]
    second = call(app, "/work")[1]
    assert sf_list(first["ratelimit"])["ip:10/m"]["r"] == 9  # the decision, before the settle
    assert sf_list(second["ratelimit"])["ip:10/m"]["r"] == 4  # 5 settled, then 1 more


def test_a_response_of_ones_own_for_refusals(rl: RateLimit) -> None:
    def refused(request: HTTPRequest, decision: Decision) -> WSGIApplication:
        def answer(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            start_response("429 Too Many Requests", [("Content-Type", "text/plain")])
            return [f"slow down, {request.client_ip}".encode()]

        return answer

    app = RateLimitMiddleware(ok, rl, [Route("/x", "ip:1/m")], refused=refused)
    call(app, "/x", REMOTE_ADDR="10.1.1.1")
    status, answer = call(app, "/x", REMOTE_ADDR="10.1.1.1")
    assert status.startswith("429")
    assert answer["body"] == b"slow down, 10.1.1.1"
    assert int(answer["retry-after"]) >= 1
    assert answer["ratelimit"].startswith('"ip:1/m";r=0')


def test_a_refused_request_never_reaches_the_app(rl: RateLimit) -> None:
    reached: list[str] = []

    def counting(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        reached.append(environ["PATH_INFO"])
        return ok(environ, start_response)

    app: Callable[..., Any] = RateLimitMiddleware(counting, rl, [Route("/x", "ip:2/m")])
    statuses = [call(app, "/x")[0][:3] for _ in range(4)]
    assert statuses == ["200", "200", "429", "429"]
    assert reached == ["/x", "/x"]


def test_extra_or_missing_leading_slashes_count_on_the_route(rl: RateLimit) -> None:
    """Werkzeug (Flask) routes ``//login`` and ``login`` as ``/login``: so must the limit,
    else a spelling gets past it (found by a red team: 5 of 5 through under ``3/m``)."""
    app = RateLimitMiddleware(
        ok, rl, [Route("/login", "ip:3/m", methods=["POST"]), Route("/*", "ip:100/m")]
    )
    codes = [call(app, path, "POST")[0][:3] for path in ("//login", "login", "///login", "/login")]
    assert codes == ["200", "200", "200", "429"]
    assert call(app, "", "GET")[1]["ratelimit-policy"]  # the root: counted by /*


def test_an_ipv6_zone_is_not_a_client_of_its_own() -> None:
    """``2001:db8::1%7`` and ``%8`` are one address: a zone must not open a new counter."""
    from ratelimit.asgi import TrustedProxies

    proxies = TrustedProxies(["127.0.0.1"], 128)
    assert proxies.grouped("2001:db8::1%7") == proxies.grouped("2001:db8::1%8") == "2001:db8::1"


def test_a_client_cannot_add_its_own_real_ip_to_the_proxys(rl: RateLimit) -> None:
    """A WSGI server joins ``X_Real_IP`` (the client's) with the proxy's ``X-Real-IP``
    into one value: a header of one address that holds two is trusted for neither, and the
    request counts as the proxy's, not as a client of the attacker's choosing."""
    app = RateLimitMiddleware(
        ok,
        rl,
        [Route("/login", "ip:3/m")],
        trusted_proxies=["10.0.0.1"],
        forwarded_header="x-real-ip",
    )
    peer = {"REMOTE_ADDR": "10.0.0.1"}
    codes = [
        call(app, "/login", **peer, HTTP_X_REAL_IP=f"198.51.100.7, 9.9.9.{n}")[0][:3]
        for n in range(4)
    ]
    assert codes == ["200", "200", "200", "429"]
    assert call(app, "/login", **peer, HTTP_X_REAL_IP="198.51.100.8")[0].startswith("200")
