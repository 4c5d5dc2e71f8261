"""Penalties kept in this process's memory (:class:`~ratelimit.backends.penalty_store.PenaltyStore`
for :class:`~ratelimit.backends.memory.MemoryBackend`): per identifier, the times of its
recent refusals and the end of its hold, on the backend's clock."""

from __future__ import annotations

from collections import deque

from ratelimit.backends.base import Clock, clock_us
from ratelimit.backends.penalty_store import PenaltyHold
from ratelimit.errors import LimiterClosedError
from ratelimit.plan import Identifier


class PenaltyTables:
    """A mixin: the memory backend's penalties. Its host sets ``_closed`` and ``_clock``."""

    _closed: bool
    _clock: Clock

    def _penalty_tables(self) -> tuple[dict[Identifier, deque[int]], dict[Identifier, int]]:
        if self._closed:
            raise LimiterClosedError("this memory backend")
        tables = self.__dict__.get("_penalties")
        if tables is None:
            tables = self.__dict__["_penalties"] = ({}, {})
        return tables

    def _hold_end(self, target: Identifier, now: int) -> int:
        holds = self._penalty_tables()[1]
        end = holds.get(target, 0)
        if end and end <= now:
            del holds[target]
            return 0
        return end

    async def note_refusal(
        self, target: Identifier, count: int, span_ms: int, hold_ms: int
    ) -> float:
        now = clock_us(self._clock)
        if self._hold_end(target, now):
            return 0.0
        refusals, holds = self._penalty_tables()
        times = refusals.setdefault(target, deque())
        while times and times[0] <= now - span_ms * 1000:
            times.popleft()
        times.append(now)
        if len(times) < count:
            return 0.0
        del refusals[target]
        holds[target] = now + hold_ms * 1000
        return hold_ms / 1000

    async def penalty_left(self, target: Identifier) -> float:
        now = clock_us(self._clock)
        end = self._hold_end(target, now)
        return (end - now) / 1_000_000 if end else 0.0

    async def list_penalties(self, namespace: str, key: str | None = None) -> list[PenaltyHold]:
        now = clock_us(self._clock)
        return [
            PenaltyHold(target.key, target.selector, target.value, (end - now) / 1_000_000)
            for target, end in list(self._penalty_tables()[1].items())
            if target.namespace == namespace
            and (key is None or target.key == key)
            and self._hold_end(target, now)
        ]

    async def lift_penalties(
        self, namespace: str, key: str, selector: str | None = None, value: str | None = None
    ) -> int:
        refusals, holds = self._penalty_tables()
        now = clock_us(self._clock)
        lifted = 0
        for table in (holds, refusals):
            for target in [
                t
                for t in table
                if t.namespace == namespace
                and t.key == key
                and (selector is None or (t.selector, t.value) == (selector, value))
            ]:
                if table is holds and self._hold_end(target, now):
                    lifted += 1
                table.pop(target, None)
        return lifted
