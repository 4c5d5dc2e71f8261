"""What a backend is: an object that decides plans. A ``Protocol``, not a registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from ratelimit.decision import Decision
from ratelimit.plan import CounterUpdate, Plan

Clock = Callable[[], float]
"""A clock returns seconds as a float; only differences between readings matter."""


@runtime_checkable
class Backend(Protocol):
    """Decides a plan atomically: counts, evaluates the tree, records the hit if allowed."""

    async def decide(self, plan: Plan) -> Decision:
        """Decide one call; record its hit on every identifier only if it is allowed."""
        ...

    async def reset(self, plan: Plan) -> None:
        """Forget every hit counted on the identifiers of ``plan`` (logs and counters)."""
        ...

    async def update_counter(self, update: CounterUpdate) -> float:
        """Kong's counter API: add to a window counter, return the sliding rate after it."""
        ...

    async def aclose(self) -> None:
        """Release what the backend opened."""
        ...


def clock_us(clock: Clock) -> int:
    """Read a clock in whole microseconds."""
    return round(clock() * 1_000_000)
