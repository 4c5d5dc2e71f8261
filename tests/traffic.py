"""Decisions under traffic while a store fails over: how long until Redis answers again,
how many decisions the failure policy answered meanwhile, and the slowest call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ratelimit import Decision


@dataclass
class Failover:
    resumed_after: float
    """Seconds from the failure until decisions were answered by the store again."""
    degraded: int
    slowest: float


async def through_a_failure(
    decide: Callable[[int], Awaitable[Decision]],
    fail: Callable[[], None],
    *,
    before: int = 200,
    settled: float = 1.0,
    give_up: float = 90.0,
) -> Failover:
    """Call ``decide(n)`` in a loop; after ``before`` calls, ``fail()`` (kill a server).
    Returns once decisions have been answered by the store (not ``degraded``) for
    ``settled`` seconds running; raises ``AssertionError`` after ``give_up`` seconds."""
    latencies: list[float] = []
    degraded = 0
    failed_at = 0.0
    resumed_at: float | None = None
    deadline = time.monotonic() + give_up
    n = 0
    while time.monotonic() < deadline:
        n += 1
        if n == before:
            fail()
            failed_at = time.monotonic()
        started = time.monotonic()
        decision = await decide(n)
        latencies.append(time.monotonic() - started)
        if decision.degraded:
            degraded += 1
            resumed_at = None
            await asyncio.sleep(0.01)  # a caller's pace, not a wait for a window
        elif failed_at and resumed_at is None:
            resumed_at = time.monotonic()
        if resumed_at is not None and time.monotonic() - resumed_at > settled:
            return Failover(resumed_at - failed_at, degraded, max(latencies))
    raise AssertionError("decisions were never answered by the store again")
