"""A command-engine lock held by someone else, seen through HTTP: a real uvicorn serving
``RateLimitMiddleware`` (tests/lock_http_app.py) on a real redis-server. A lock held past
``lock_timeout`` is contention on a store that answers: the request is refused as a degraded
decision (503 with problem details, ``Retry-After`` until the holder's lock ends), never
admitted and never a bare 500, and it is not logged as a storage outage."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.http_server import UvicornServer
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

NAMESPACE = "lock-http"
LOCK = f"rl:{{{NAMESPACE}:ping}}:lock"


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_a_stuck_lock_is_a_503_with_problem_details(redis: RedisServer, on_error: str) -> None:
    import redis as redis_py

    store = redis_py.Redis.from_url(redis.url)
    store.flushdb()
    env = {
        "RL_LOCK_STORAGE": redis.url,
        "RL_LOCK_NAMESPACE": NAMESPACE,
        "RL_LOCK_ON_ERROR": on_error,
    }
    server = UvicornServer("tests.lock_http_app:create", env=env, factory=True).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            assert http.get("/ping").status_code == 200  # the lock is free: counted
            store.set(LOCK, "someone else", px=30_000)  # a holder that hangs
            stuck = [http.get("/ping") for _ in range(3)]
            store.delete(LOCK)
            after = http.get("/ping")
    finally:
        output = server.stop()
        store.close()
    for response in stuck:
        assert response.status_code == 503, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert 25 <= int(response.headers["retry-after"]) <= 30  # until the lock's ttl ends
        problem = json.loads(response.content)
        assert problem["status"] == 503
        assert response.content != b"pong"  # the endpoint did not run
    assert after.status_code == 200  # the lock gone: served, counted
    assert "storage failed" not in output  # contention, not an outage
    assert output.count("lock contention") == 1  # one warning for the three refusals
    assert "Traceback" not in output
