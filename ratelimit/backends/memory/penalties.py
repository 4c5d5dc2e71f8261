"""Penalties kept in this process's memory (:class:`~ratelimit.backends.penalty_store.PenaltyStore`
for :class:`~ratelimit.backends.memory.backend.MemoryBackend`): per identifier, the times of its
recent refusals and the end of its hold, on the backend's clock."""

from __future__ import annotations

from collections import deque

from ratelimit.backends.base import Clock, clock_us
from ratelimit.backends.penalty_store import PenaltyHold
from ratelimit.core.plan import Identifier
from ratelimit.errors import LimiterClosedError

SWEEP_EVERY = 1024
"""Refusals noted between sweeps of what is kept (at least)."""


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

    def _sweep_penalties(self, now: int) -> None:
        """Every :data:`SWEEP_EVERY` notes (or a quarter as many as are kept, when more):
        forget the refusals past their span and the holds past their end, of identifiers
        not seen since (refused once, never again: kept for ever before)."""
        refusals, holds = self._penalty_tables()
        swept = self.__dict__.setdefault("_penalty_sweep", [0, SWEEP_EVERY])
        swept[0] += 1
        if swept[0] < swept[1]:
            return
        spans: dict[Identifier, int] = self.__dict__.setdefault("_penalty_spans", {})
        for target, span in list(spans.items()):
            times = refusals.get(target)
            if not times or times[-1] <= now - span:
                refusals.pop(target, None)
                del spans[target]
        for target in [t for t, end in holds.items() if end <= now]:
            del holds[target]
        swept[:] = [0, max(SWEEP_EVERY, (len(refusals) + len(holds)) // 4)]

    async def note_refusal(
        self, target: Identifier, count: int, span_ms: int, hold_ms: int
    ) -> float:
        now = clock_us(self._clock)
        self._sweep_penalties(now)
        if self._hold_end(target, now):
            return 0.0
        refusals, holds = self._penalty_tables()
        self.__dict__.setdefault("_penalty_spans", {})[target] = span_ms * 1000
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

    def held_now(self, target: Identifier) -> bool:
        """Whether ``target`` may be held back (a hold kept, ended or not): what the
        direct path asks without a coroutine before it decides a penalized limit's call
        (:meth:`ratelimit.penalties.penalizer.Penalizer.unheld`); :meth:`penalty_left`
        says how long."""
        tables = self.__dict__.get("_penalties")
        return tables is not None and target in tables[1]

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
