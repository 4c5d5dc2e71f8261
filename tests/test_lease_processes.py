"""Leases across OS processes on a real Redis and on a cluster of three nodes: four processes
hammer one hot limit, and the test counts what each admitted, by wall-clock time, in every
window of the limit."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from ratelimit.backends.leases.sizing import SHARE
from tests.lease_worker import per_window
from tests.redis_server import RedisCluster
from tests.workers import run_workers

pytestmark = [pytest.mark.redis, pytest.mark.long, pytest.mark.timeout(120)]

COUNT = 100
SPAN = 0.5
WINDOWS = 20
PROCESSES = 4


async def _hammered(
    redis_url: str, redis_client: aioredis.Redis, algorithm: str, storage: str = ""
) -> tuple[list[tuple[float, float]], int]:
    """Four processes of eight coroutines hammering ``apikey:100/500ms`` leased for 50 ms
    for 21 spans (on ``storage``, else the Redis at ``redis_url``): each admission as
    (asked, admitted) wall-clock times, and the calls made."""
    namespace = f"lease-{uuid.uuid4().hex[:8]}"
    seconds = str(SPAN * (WINDOWS + 1))
    outputs = await run_workers(
        redis_client,
        namespace,
        "tests.lease_worker",
        *(redis_url, namespace, algorithm, f"apikey:{COUNT}/500ms", seconds, "0.05", "8"),
        *([storage] if storage else []),
        count=PROCESSES,
    )
    results = [json.loads(out) for out in outputs]
    admitted = [(float(a), float(b)) for result in results for a, b in result["admitted"]]
    return admitted, sum(int(result["calls"]) for result in results)


@pytest.fixture(params=["redis", "cluster"])
def storage(request: pytest.FixtureRequest) -> Iterator[str]:
    """Where the workers' limiter counts: the test's Redis (``""``), or a cluster of three
    nodes of its own (``redis+cluster://``)."""
    if request.param == "redis":
        yield ""
        return
    if os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL points at one server; the cluster test starts its own nodes")
    with RedisCluster() as cluster:
        yield cluster.url.replace("redis://", "redis+cluster://", 1)


async def test_four_processes_never_admit_past_a_sliding_log_in_any_span(
    redis_url: str, redis_client: aioredis.Redis, storage: str
) -> None:
    """The sliding log: no span of 500 ms (starting at any call) holds more than 100
    calls surely admitted in it (asked and admitted within it)."""
    admitted, calls = await _hammered(redis_url, redis_client, "sliding-log", storage)
    admitted.sort()
    assert calls > len(admitted) >= COUNT * WINDOWS // 2
    for i, (start, _) in enumerate(admitted):
        inside = 0
        for asked, done in admitted[i:]:
            if asked >= start + SPAN:
                break
            inside += done < start + SPAN
        assert inside <= COUNT, f"{inside} calls in the 500 ms from {start}"


async def test_four_processes_never_admit_past_a_fixed_window_limit_in_any_window(
    redis_url: str, redis_client: aioredis.Redis, storage: str
) -> None:
    """Fixed windows: no window admits more than 100 calls (each admission counted in the
    window it surely ran in: asked and admitted within it), and every whole window admits
    at least 100 less what four leases may hold unused."""
    admitted, calls = await _hammered(redis_url, redis_client, "fixed-window", storage)
    surely, anywhere = per_window(admitted, SPAN)
    assert surely, "nothing admitted"
    assert max(surely.values()) <= COUNT, sorted(surely.items())
    windows = sorted(anywhere)
    whole = windows[1:-1]  # the first and last were only partly hammered
    assert len(whole) >= WINDOWS - 2
    unused = PROCESSES * max(1, int(SHARE * COUNT))  # what four leases may hold unused
    assert all(anywhere[w] >= COUNT - unused for w in whole), sorted(anywhere.items())
    assert calls > len(admitted)  # it was hammered past the limit
