"""Leases across OS processes on a real Redis: four processes hammer one hot limit, and the
test counts what each admitted, by wall-clock time, in every window of the limit."""

from __future__ import annotations

import json
import math
import uuid
from collections import Counter

import pytest
import redis.asyncio as aioredis

from ratelimit.backends.leases.sizing import SHARE
from tests.workers import run_workers

pytestmark = [pytest.mark.redis, pytest.mark.long, pytest.mark.timeout(120)]

COUNT = 100
SPAN = 0.5
WINDOWS = 20
PROCESSES = 4


async def test_four_processes_never_admit_past_a_fixed_window_limit_in_any_window(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    """``apikey:100/500ms`` (fixed windows), leased for 50 ms by four processes of eight
    coroutines, hammered for 20 windows: no window admits more than 100 calls (each
    admission counted in the window it surely ran in: asked and admitted within it), and
    every whole window admits at least 100 less what four leases may hold unused."""
    namespace = f"lease-{uuid.uuid4().hex[:8]}"
    seconds = str(SPAN * (WINDOWS + 1))
    outputs = await run_workers(
        redis_client,
        namespace,
        "tests.lease_worker",
        *(redis_url, namespace, "fixed-window", f"apikey:{COUNT}/500ms", seconds, "0.05", "8"),
        count=PROCESSES,
    )
    results = [json.loads(out) for out in outputs]
    admitted = [tuple(pair) for result in results for pair in result["admitted"]]
    surely: Counter[int] = Counter()
    anywhere: Counter[int] = Counter()
    for before, after in admitted:
        first, last = math.floor(before / SPAN), math.floor(after / SPAN)
        if first == last:
            surely[first] += 1
        for window in range(first, last + 1):
            anywhere[window] += 1
    assert surely, "nothing admitted"
    assert max(surely.values()) <= COUNT, sorted(surely.items())
    windows = sorted(anywhere)
    whole = windows[1:-1]  # the first and last were only partly hammered
    assert len(whole) >= WINDOWS - 2
    unused = PROCESSES * max(1, int(SHARE * COUNT))  # what four leases may hold unused
    assert all(anywhere[w] >= COUNT - unused for w in whole), sorted(anywhere.items())
    calls = sum(int(result["calls"]) for result in results)
    assert calls > len(admitted)  # it was hammered past the limit
