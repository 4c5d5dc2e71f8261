"""Issue 37, item 6: the migration guide's ports limit as the apps they port did. Each
peer's app, as its users wrote it (tests/migrating_slowapi_before.py,
tests/migrating_flask_before.py), and its port (the ``_after`` modules), which
docs/migrating.md shows, get the same requests: per IP, per API key, with and without the
key, the default limit, the exempt route, and the multi-limit route across its minute and
hour windows on a clock the test steps (tests/migrating_clock.py). Both answer alike, and
as expected. FastAPI apps run under a real uvicorn (``--proxy-headers``: the client is the
``X-Forwarded-For`` the test sends, as a proxy in front of both would), driven by httpx;
Flask apps through Flask's test client."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("slowapi", reason="the bench extra (slowapi, flask-limiter)")
pytest.importorskip("flask_limiter", reason="the bench extra (slowapi, flask-limiter)")

from tests.http_server import ROOT, UvicornServer
from tests.migrating_clock import EXPIRE_EVENTS, FileClock, ours_on, peer_on

pytestmark = pytest.mark.timeout(120)

Send = Callable[[str, str, str, "str | None"], Any]
"""(method, path, client IP, API key or None) -> the response."""

EXPECTED = {
    "POST /login from A": [200] * 5 + [429],
    "POST /login from B": [200],
    "GET /api/items, key k1, from A": [200] * 20 + [429],
    "GET /api/items, key k1, from B": [429],  # per key, wherever it comes from
    "GET /api/items, key k2, from A": [200],
    "GET /api/items, no key, from A": [200] * 20 + [429],  # per IP without a key
    "GET /api/items, no key, from B": [200],
    "GET /about from A": [200] * 10 + [429],  # default_limits
    "GET /about from B": [200],
    "GET /health from A": [200] * 12,  # exempt
    **{f"GET /search from C, minute {n}": [200, 200, 200, 429] for n in range(6)},
    "GET /search from C, minute 6": [200, 200, 429, 429],  # 20 in the hour
    "GET /search from C, minute 7": [429] * 4,
    "GET /search from D, minute 7": [200, 200, 200, 429],  # per IP, the hour too
    "GET /search from C, an hour on": [200, 200, 200, 429],
}


def scenario(send: Send, advance: Callable[[float], None]) -> dict[str, list[int]]:
    """The statuses of the same requests, by what they were."""
    seen: dict[str, list[int]] = {}

    def record(name: str, times: int, method: str, path: str, ip: str, key: str | None) -> None:
        seen[name] = [send(method, path, ip, key).status_code for _ in range(times)]

    a, b, c, d = "203.0.113.1", "203.0.113.2", "203.0.113.3", "203.0.113.4"
    record("POST /login from A", 6, "POST", "/login", a, None)
    record("POST /login from B", 1, "POST", "/login", b, None)
    record("GET /api/items, key k1, from A", 21, "GET", "/api/items", a, "k1")
    record("GET /api/items, key k1, from B", 1, "GET", "/api/items", b, "k1")
    record("GET /api/items, key k2, from A", 1, "GET", "/api/items", a, "k2")
    record("GET /api/items, no key, from A", 21, "GET", "/api/items", a, None)
    record("GET /api/items, no key, from B", 1, "GET", "/api/items", b, None)
    record("GET /about from A", 11, "GET", "/about", a, None)
    record("GET /about from B", 1, "GET", "/about", b, None)
    record("GET /health from A", 12, "GET", "/health", a, None)
    for minute in range(8):
        record(f"GET /search from C, minute {minute}", 4, "GET", "/search", c, None)
        if minute < 7:
            advance(61)
    record("GET /search from D, minute 7", 4, "GET", "/search", d, None)
    advance(3600)
    record("GET /search from C, an hour on", 4, "GET", "/search", c, None)
    return seen


class SteppedClock:
    """The time the apps read (a file: tests/migrating_clock.py), stepped by the test;
    replaced whole, so that a reader never sees it half written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.now = float(int(time.time()))
        self._write()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self._write()

    def _write(self) -> None:
        written = self.path.with_suffix(".new")
        written.write_text(str(self.now))
        os.replace(written, self.path)


def headers_of(ip: str, key: str | None) -> dict[str, str]:
    return {"X-Forwarded-For": ip, **({"X-API-Key": key} if key else {})}


@pytest.fixture
def clock(tmp_path: Path) -> SteppedClock:
    return SteppedClock(tmp_path / "clock")


def served(app: str, clock: SteppedClock) -> UvicornServer:
    env = {"RL_MIGRATING_CLOCK": str(clock.path)}
    return UvicornServer(f"tests.migrating_clock:{app}", env, factory=True, proxy_headers=True)


@pytest.fixture
def slowapi_servers(clock: SteppedClock) -> Iterator[tuple[UvicornServer, UvicornServer]]:
    with served("slowapi_before", clock) as before, served("slowapi_after", clock) as after:
        yield before, after


def test_the_slowapi_port_limits_as_the_slowapi_app(
    slowapi_servers: tuple[UvicornServer, UvicornServer], tmp_path: Path
) -> None:
    answers = []
    for n, server in enumerate(slowapi_servers):
        clock = SteppedClock(tmp_path / "clock")  # both start at one time
        with server.sync_client(timeout=10) as http:

            def send(method: str, path: str, ip: str, key: str | None) -> Any:
                return http.request(method, path, headers=headers_of(ip, key))

            answers.append(scenario(send, clock.advance))
            reset = send("GET", "/about", "203.0.113.9", None).headers["X-RateLimit-Reset"]
        assert answers[n] == EXPECTED, ("slowapi", "ported")[n]
        assert reset_is(reset, clock.now) == ("epoch", "seconds")[n]


def flask_send(app: Any) -> Send:
    client = app.test_client()

    def send(method: str, path: str, ip: str, key: str | None) -> Any:
        headers = {"X-API-Key": key} if key else {}
        return client.open(path, method=method, headers=headers, environ_base={"REMOTE_ADDR": ip})

    return send


def test_the_flask_port_limits_as_the_flask_limiter_app(
    clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import limits.storage.memory

    monkeypatch.setattr(limits.storage.memory, "time", vars(limits.storage.memory)["time"])
    monkeypatch.setattr(*EXPIRE_EVENTS, getattr(*EXPIRE_EVENTS))  # restored after
    for n, (made_on, name) in enumerate([(peer_on, "before"), (ours_on, "after")]):
        clock = SteppedClock(clock.path)  # both start at one time
        send = flask_send(made_on(FileClock(clock.path), f"tests.migrating_flask_{name}").app)
        assert scenario(send, clock.advance) == EXPECTED, name
        reset = send("GET", "/about", "203.0.113.9", None).headers["X-RateLimit-Reset"]
        assert reset_is(reset, clock.now) == ("epoch", "seconds")[n]


def reset_is(value: str, now: float) -> str:
    """What an ``X-RateLimit-Reset`` of a minute's window just begun says: the epoch time
    of the reset (the peers) or the seconds until it (the ports, as the guide says)."""
    if abs(float(value) - (now + 60)) <= 1:
        return "epoch"
    return "seconds" if value == "60" else f"neither: {value}"


def test_the_page_shows_the_ported_apps_as_they_are_tested() -> None:
    page = (ROOT / "docs" / "migrating.md").read_text()
    for name, first in [("slowapi", "from fastapi"), ("flask", "from flask")]:
        for which in ("before", "after"):
            text = (ROOT / "tests" / f"migrating_{name}_{which}.py").read_text()
            code = text[text.index(f"\n{first}") + 1 :]
            assert f"```python\n{code}```" in page, f"migrating_{name}_{which}.py"


def test_flask_routes_add_to_view_limits_on_one_counter_for_all_paths() -> None:
    # what the guide says of Route("/*") under Flask: decided beside a view's own limit,
    # and one counter for every path it matches (flask-limiter's application_limits)
    from flask import Flask

    from ratelimit import MemoryBackend
    from ratelimit.flask import FlaskRateLimit, Route
    from ratelimit.sync import RateLimit

    rl = RateLimit(MemoryBackend())
    app = Flask(__name__)
    limits = FlaskRateLimit(rl, app, routes=[Route("/*", "ip:5/minute")])

    @app.get("/one")
    @limits.limit("ip:2/minute")
    def one() -> str:
        return "ok"

    @app.get("/two")
    def two() -> str:
        return "ok"

    client = app.test_client()
    try:
        assert [client.get("/one").status_code for _ in "abc"] == [200, 200, 429]  # the view's 2
        # "/*" counted all three (the view refused the third after it): 5 across both paths
        assert [client.get("/two").status_code for _ in "abc"] == [200, 200, 429]
    finally:
        rl.close()
