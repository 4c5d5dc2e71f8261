"""Flask and Django applications under a real gunicorn (gthread workers: several processes
of several threads), driven by httpx over TCP, on a real Redis: exact admission across
workers, the header fields parsed strictly, forwarded-header spoofing refused, and a Redis
killed mid-traffic answered by the failure policy, never a 500."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.gunicorn_server import GunicornServer
from tests.redis_server import RedisServer
from tests.test_wsgi import sf_list

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120), pytest.mark.once, pytest.mark.long]
APPS = {"flask": "tests.flask_project:app", "django": "tests.django_project:application"}


def serve(
    app: str, url: str, workers: int = 3, threads: int = 4, preload: bool = False, **env: str
) -> GunicornServer:
    variables = {
        "RATELIMIT_TEST_URL": url,
        "RATELIMIT_TEST_NAMESPACE": f"t-{uuid.uuid4().hex[:10]}",
        **env,
    }
    extra = ["--preload"] if preload else []
    return GunicornServer(APPS[app], variables, workers, threads, extra).start(timeout=60)


def at_once(
    server: GunicornServer, n: int, method: str, path: str, **options: object
) -> list[httpx.Response]:
    """``n`` requests sent together, each on a connection of its own."""
    gate = threading.Barrier(n)

    def one(_: int) -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            gate.wait()
            return http.request(method, path, **options)  # type: ignore[arg-type]

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def check_fields(answer: httpx.Response, policy: str, quota: int) -> None:
    """The draft-11 fields of an answer, parsed as Structured Fields."""
    assert sf_list(answer.headers["ratelimit-policy"])[policy]["q"] == quota
    remaining = sf_list(answer.headers["ratelimit"])[policy]
    assert 0 <= remaining["r"] < quota
    assert 0 < remaining["t"] <= 60
    if answer.status_code == 429:
        assert remaining["r"] == 0
        assert 0 < int(answer.headers["retry-after"]) <= 60
        assert answer.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(
    ("app", "preload"), [("flask", False), ("flask", True), ("django", False)],
    ids=["flask", "flask-preload", "django"],
)  # fmt: skip
def test_exact_admission_across_workers(redis_url: str, app: str, preload: bool) -> None:
    """``5/m`` admits 5 of 40 concurrent requests spread over 3 workers of 4 threads (a
    route's limit, and a view's reading the JSON body); with ``--preload`` the limiter was
    made in the parent before the fork."""
    server = serve(app, redis_url, preload=preload)
    try:
        key = {"X-API-Key": uuid.uuid4().hex}
        routed = at_once(server, 40, "GET", "/keyed", headers=key)
        user = {"username": uuid.uuid4().hex}
        viewed = at_once(server, 40, "POST", "/login", json=user)
    finally:
        output = server.stop()
    assert Counter(a.status_code for a in routed) == {200: 5, 429: 35}, output
    for answer in routed:
        check_fields(answer, "apikey:5/m", 5)
    limit = 5 if app == "flask" else 3  # the Django project's login allows 3 a minute
    assert Counter(a.status_code for a in viewed) == {200: limit, 429: 40 - limit}, output
    for answer in viewed:
        check_fields(answer, f"username:{limit}/m", limit)


@pytest.mark.parametrize("app", ["flask", "django"])
def test_forwarded_header_spoofing_is_refused(redis_url: str, app: str) -> None:
    """Untrusted, the peer counts whatever ``X-Forwarded-For`` says; trusted, the
    rightmost address not a proxy's counts, whatever a client put before it; gunicorn drops
    an ``X_Forwarded_For`` header, which would otherwise read as ``X-Forwarded-For``."""
    untrusted = serve(app, redis_url, workers=2)
    try:
        with httpx.Client(base_url=untrusted.url, timeout=30) as http:
            spoofed = [
                http.get("/ip", headers={"X-Forwarded-For": f"198.51.100.{n}"}).status_code
                for n in range(4)
            ]
    finally:
        untrusted.stop()
    assert spoofed == [200, 200, 429, 429]
    trusted = serve(app, redis_url, workers=2, RATELIMIT_TEST_PROXIES="127.0.0.1")
    try:
        with httpx.Client(base_url=trusted.url, timeout=30) as http:
            chain = [
                http.get("/ip", headers={"X-Forwarded-For": f"6.6.6.{n}, 203.0.113.9"}).status_code
                for n in range(3)
            ]
            underscored = [
                http.get(
                    "/ip",
                    headers={"X-Forwarded-For": "203.0.113.10", "X_Forwarded_For": f"7.7.7.{n}"},
                ).status_code
                for n in range(3)
            ]
    finally:
        trusted.stop()
    assert chain == [200, 200, 429]  # all on 203.0.113.9
    assert underscored == [200, 200, 429]  # all on 203.0.113.10


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.mark.parametrize(
    ("app", "on_error"), [("flask", "allow"), ("flask", "deny"), ("django", "deny")]
)
def test_redis_killed_mid_traffic_is_the_policy_never_a_500(
    own_redis: RedisServer, app: str, on_error: str
) -> None:
    server = serve(app, own_redis.url, workers=2, RATELIMIT_TEST_ON_ERROR=on_error)
    answers: list[tuple[str, int]] = []  # (before, during or after the kill, status)
    killing = threading.Event()
    killed = threading.Event()
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            n = 0
            while not stop.is_set():
                n += 1
                started = killed.is_set()
                status = http.get("/keyed", headers={"X-API-Key": f"k{n % 50}"}).status_code
                # "before": answered before the kill began; "after": asked once it ended
                when = "after" if started else "during" if killing.is_set() else "before"
                answers.append((when, status))

    try:
        threads = [threading.Thread(target=traffic) for _ in range(4)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while (
            sum(1 for when, _ in answers if when == "before") < 40 and time.monotonic() < deadline
        ):
            time.sleep(0.01)  # waiting for traffic to flow, not for a window
        killing.set()
        own_redis.stop()
        killed.set()
        while sum(1 for when, _ in answers if when == "after") < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
        for thread in threads:
            thread.join(30)
    finally:
        output = server.stop()
    before = Counter(status for when, status in answers if when == "before")
    after = Counter(status for when, status in answers if when == "after")
    assert set(before) <= {200, 429}, output
    assert 500 not in Counter(status for _, status in answers), output
    assert sum(after.values()) >= 40, output
    assert 500 not in after, output
    degraded = 200 if on_error == "allow" else 503
    assert set(after) <= {200, 429, degraded}, (after, output)
    assert after[degraded] > 0, (after, output)  # the policy answered once Redis was gone
