"""``Route(delay=)`` under real uvicorn processes: one on memory, several sharing one
redis-server (or PostgreSQL) started by the tests (tests/http_delay_apps.py). A spike from
one client address: every admission is the store's, so the admitted never exceed what the
rules allow over the time the spike took, across processes; refused requests wait and are
admitted as the rule frees. Bounds only, never timings: the machine's speed decides when
requests arrive, not how many the rules admit."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.http_server import UvicornServer

pytestmark = pytest.mark.timeout(180)

APP = "tests.http_delay_apps:app"


@contextlib.contextmanager
def servers(
    count: int, storage: str, rules: str, delay: float, algorithm: str = "sliding-log"
) -> Iterator[list[UvicornServer]]:
    """``count`` uvicorn processes counting in ``storage`` under one namespace."""
    env = {
        "RL_TEST_ALGORITHM": algorithm,
        "RL_TEST_STORAGE": storage,
        "RL_TEST_NAMESPACE": f"delay-{uuid.uuid4().hex[:8]}",
        "RL_TEST_RULES": rules,
        "RL_TEST_DELAY": str(delay),
    }
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(UvicornServer(APP, env, factory=True)) for _ in range(count)]


async def spike(running: list[UvicornServer], each: int) -> tuple[list[httpx.Response], float]:
    """``each`` requests at once to every server; the responses and the seconds they took."""
    clients = [server.client(timeout=30) for server in running]
    async with contextlib.AsyncExitStack() as stack:
        for client in clients:
            await stack.enter_async_context(client)
        started = time.monotonic()
        responses = await asyncio.gather(
            *(client.get(f"/api/{n}") for client in clients for n in range(each))
        )
        return list(responses), time.monotonic() - started


def check_spike(
    responses: list[httpx.Response], took: float, per_second: int, windows: int | None = None
) -> list[int]:
    """Admitted within what ``per_second`` allows over ``took`` seconds (a sliding log's
    exact window of 1 s: in ``floor(took) + 1`` windows; else ``windows``), and more than
    refusing at once would; every other a 429 with ``Retry-After``. The processes that
    admitted, by id (which ones is the store's choice)."""
    admitted = [r for r in responses if r.status_code == 200]
    print(f"admitted {len(admitted)} of {len(responses)} in {took:.2f} s")
    refused = [r for r in responses if r.status_code != 200]
    assert all(r.status_code == 429 and "retry-after" in r.headers for r in refused)
    assert len(admitted) <= per_second * (windows or math.floor(took) + 1)
    # a refused request waits up to its delay: it is refused only when the rule stays full
    # that long, so more than one window's worth are admitted
    assert len(admitted) >= 2 * per_second
    return sorted({r.json()["pid"] for r in admitted})


async def waiting_becomes(http: httpx.AsyncClient, count: int, within: float) -> None:
    """Poll the server until ``count`` requests wait there; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while (now := (await http.get("/waiting")).json()) != count:
        assert time.monotonic() < deadline, f"{now} waiting, not {count}"
        await asyncio.sleep(0.02)


def test_a_client_that_leaves_stops_waiting_under_uvicorn() -> None:
    """On ip:1/30s with delay=50 a second request would wait 30 s; its client leaves, and
    uvicorn's http.disconnect ends its wait at once (checked well within those 30 s)."""

    async def main(server: UvicornServer) -> None:
        async with server.client(timeout=60) as http, server.client(timeout=60) as leaving:
            assert (await http.get("/api/first")).status_code == 200
            waiter = asyncio.ensure_future(leaving.get("/api/second"))
            await waiting_becomes(http, 1, within=10)
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
            await leaving.aclose()  # the connection closes: the client has left
            await waiting_becomes(http, 0, within=10)

    with servers(1, "memory://", "ip:1/30s", 50.0) as (server,):
        asyncio.run(main(server))


def test_a_spike_waits_its_turn_under_one_uvicorn_on_memory() -> None:
    with servers(1, "memory://", "ip:5/s", 3.0) as running:
        responses, took = asyncio.run(spike(running, 15))
    check_spike(responses, took, 5)


@pytest.mark.long
@pytest.mark.redis
def test_a_spike_across_three_processes_on_redis_never_passes_the_rule(redis_url: str) -> None:
    with servers(3, redis_url, "ip:5/s", 3.0) as running:
        responses, took = asyncio.run(spike(running, 10))
    check_spike(responses, took, 5)


@pytest.mark.long
@pytest.mark.redis
def test_a_long_rule_admits_exactly_its_count_across_three_processes(redis_url: str) -> None:
    """ip:10/h with delay=3: nothing frees within the delay, so exactly 10 are admitted
    across the processes and every other request is refused (without waiting: its refusal
    outlasts the delay)."""
    with servers(3, redis_url, "ip:10/h", 3.0) as running:
        responses, _ = asyncio.run(spike(running, 10))
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 10
    assert statuses.count(429) == 20
    assert min(int(r.headers["retry-after"]) for r in responses if r.status_code == 429) > 3


@pytest.mark.long
@pytest.mark.postgres
def test_a_spike_across_two_processes_on_postgres_never_passes_the_rule(
    postgres_url: str,
) -> None:
    """PostgreSQL keeps fixed windows: a spike of ``took`` seconds spans at most
    ``ceil(took) + 1`` of them."""
    with servers(2, postgres_url, "ip:5/s", 3.0, "fixed-window") as running:
        responses, took = asyncio.run(spike(running, 10))
    check_spike(responses, took, 5, math.ceil(took) + 1)
