"""The in-process backend (``memory://``): the Redis scripts' logs, counters and arrival
times, in dicts; each feature in a module of its own (``decisions``, ``settles``,
``resets``, ``slots``, ``overrides``, ``penalties``), a mixin of :class:`MemoryBackend`.

Decisions in one process only; nothing is shared with other processes. Safe for many
coroutines and threads at once (a decision takes no await between counting and recording).
Identifiers whose data have expired are swept away, so memory follows the live identifiers.
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

from ratelimit.algorithms import (
    Algorithm,
    Arrival,
    not_before,
    window_index,
)
from ratelimit.backends import windows
from ratelimit.backends.base import Clock, clock_us
from ratelimit.backends.layout import (
    counter_update_rate,
)
from ratelimit.backends.memory.admit import Admit, AdmitIdentified, admitter, identified
from ratelimit.backends.memory.decisions import DecisionTables
from ratelimit.backends.memory.entries import Arrivals, Log, Windows
from ratelimit.backends.memory.overrides import OverrideTables
from ratelimit.backends.memory.penalties import PenaltyTables
from ratelimit.backends.memory.resets import ResetTables
from ratelimit.backends.memory.settles import SettleTables
from ratelimit.backends.memory.slots import SlotTables
from ratelimit.core.checks import check_clock
from ratelimit.core.decision import Decision
from ratelimit.core.plan import CompiledTree, CounterUpdate, Identifier, Plan
from ratelimit.core.settling import Settlement
from ratelimit.errors import LimiterClosedError


class MemoryBackend(
    DecisionTables, SettleTables, ResetTables, SlotTables, OverrideTables, PenaltyTables
):
    """Sliding logs and window counters in this process's memory.

    ``clock`` (seconds, default ``time.monotonic``) may be replaced by a fake one in tests;
    ``sweep_every`` is how many decisions pass between sweeps of expired identifiers (or a
    quarter as many as identifiers are held, when more: a sweep walks them all, so it costs
    each decision about the same whatever their number, and what expired meanwhile stays
    below a quarter of what is held).

    Example::

        rl = RateLimit(MemoryBackend())      # the same as RateLimit.from_url("memory://")
    """

    def __init__(self, *, clock: Clock | None = None, sweep_every: int = 1024) -> None:
        check_clock(clock)  # as Settings checks it
        self.clock = clock  # the injected clock, if any
        self._clock: Clock = clock or time.monotonic
        self._logs: dict[Identifier, Log] = {}
        self._windows: dict[Identifier, Windows] = {}
        self._arrivals: dict[Identifier, Arrivals] = {}
        self._stores: tuple[dict[Identifier, Any], ...] = (
            self._logs,
            self._windows,
            self._arrivals,
        )
        """Every algorithm's store, each entry with its ``expires_us``: what ``len``,
        :meth:`reset`, the sweep and :meth:`aclose` walk (a new algorithm adds its own)."""
        self._slots: dict[Identifier, dict[str, int]] = {}  # holders' tokens: lease ends (us)
        self._revoked: dict[tuple[str, str, str], int] = {}  # claims given back: until (us)
        self._resets: dict[Identifier, tuple[int, int]] = {}  # reset at, kept until (us)
        self._lock = threading.Lock()
        self._sweep_every = max(1, sweep_every)
        self._sweep_at = self._sweep_every  # or every identifier held, when more
        self._since_sweep = 0
        self._closed = False

    def __len__(self) -> int:
        """How many identifiers hold logs or counters (expired ones until the next sweep)."""
        return sum(map(len, self._stores))

    def logs(self) -> dict[Identifier, tuple[int, ...]]:
        """Every sliding log held (expired ones until the next sweep): its hits' times in
        microseconds, newest first. For tests and debugging; a copy."""
        with self._lock:
            return {identifier: tuple(log.hits) for identifier, log in self._logs.items()}

    def counters(self) -> dict[Identifier, dict[tuple[int, int], float]]:
        """Every identifier's window counters held: per (window size in microseconds,
        window index), its count. For tests and debugging; a copy."""
        with self._lock:
            return {
                identifier: {
                    (size, index): count
                    for size, slots in entry.slots.items()
                    for index, count in windows.held(slots).items()
                }
                for identifier, entry in self._windows.items()
            }

    def arrivals(self) -> dict[Identifier, dict[str, Arrival]]:
        """Every identifier's GCRA arrival times held (microseconds and remainder, see
        :data:`~ratelimit.algorithms.Arrival`), per rule field. For tests and debugging."""
        with self._lock:
            return {identifier: dict(a.tats) for identifier, a in self._arrivals.items()}

    async def decide(self, plan: Plan) -> Decision:
        if self._closed:
            raise LimiterClosedError("this memory backend")
        with self._lock:
            return self._decide(plan)

    def admit(self, plan: Plan) -> Decision | None:
        """Decide and record ``plan`` as :meth:`decide` does, without a coroutine: ``None``
        when admitted, the refusal otherwise."""
        if self._closed:
            raise LimiterClosedError("this memory backend")
        with self._lock:
            return self._refused(self._decide(plan))

    def decide_now(self, plan: Plan) -> Decision:
        """:meth:`decide`, without a coroutine: the direct path's, for a limiter whose
        hooks read every decision (:func:`ratelimit.front.direct.whole`)."""
        if self._closed:
            raise LimiterClosedError("this memory backend")
        with self._lock:
            return self._decide(plan)

    def admitter(self, compiled: CompiledTree, algorithm: Algorithm) -> Admit:
        """:meth:`admit` for the plans of ``compiled`` under ``algorithm``, as quick as their
        shape allows (:mod:`~ratelimit.backends.memory.admit`): the direct path's."""
        return admitter(self, compiled, algorithm)

    def identified(self, compiled: CompiledTree, algorithm: Algorithm) -> AdmitIdentified | None:
        """One call of cost 1 admitted on an identifier, when ``compiled`` allows it (the
        fused direct path's; :func:`~ratelimit.backends.memory.admit.identified`)."""
        return identified(self, compiled, algorithm)

    @staticmethod
    def _refused(decision: Decision) -> Decision | None:
        return None if decision.allowed else decision

    def _decide(self, plan: Plan) -> Decision:
        now = clock_us(self._clock)
        self._since_sweep += 1
        if self._since_sweep >= self._sweep_at:
            self._sweep(now)
        return self._DECIDE[plan.algorithm.name](self, plan, now)

    async def settle(self, settlement: Settlement) -> None:
        self.settle_now(settlement)

    def settle_now(self, settlement: Settlement) -> None:
        """:meth:`settle`, without a coroutine: ``Decider.settle`` writes a settle here at
        once, with no task to run it (:func:`ratelimit.pipeline.settle_writes.settle_now`)."""
        self._check_open()
        if settlement.empty:
            return
        with self._lock:
            now = clock_us(self._clock)
            self._SETTLE[settlement.plan.algorithm.name](self, settlement, now)

    schemes: ClassVar[tuple[str, ...]] = ("memory",)
    """The storage URLs that open it (``memory://``, for ``RateLimit.from_url``)."""

    async def update_counter(self, update: CounterUpdate) -> float:
        if self._closed:
            raise LimiterClosedError("this memory backend")
        with self._lock:
            now = clock_us(self._clock)
            entry = self._windows.get(update.identifier)
            if entry is None or entry.expires_us <= now:
                entry = Windows()
            now = not_before(now, entry.newest(update.size_us), update.size_us)
            index = window_index(now, update.size_us)
            current, previous = entry.counted(update.size_us, index)
            rate = counter_update_rate(update, current, previous, now)
            if update.value:
                entry.hold(update.size_us, index, current + update.value)
                entry.expires_us = max(entry.expires_us, now + 2 * update.size_us)
                self._windows[update.identifier] = entry
            return rate

    def _sweep(self, now: int) -> None:
        self._since_sweep = 0
        for table in self._stores:
            expired = [i for i, entry in table.items() if entry.expires_us <= now]
            for identifier in expired:
                del table[identifier]
        ended = [i for i, holders in self._slots.items() if max(holders.values(), default=0) <= now]
        for identifier in ended:  # every holder's lease ended: a crashed process's slots
            del self._slots[identifier]
        for claim in [c for c, until in self._revoked.items() if until <= now]:
            del self._revoked[claim]
        for identifier in [i for i, (_, until) in self._resets.items() if until <= now]:
            del self._resets[identifier]
        self._sweep_at = max(self._sweep_every, len(self) // 4)  # a walk's cost, shared

    async def aclose(self) -> None:
        self._closed = True
        with self._lock:
            for store in self._stores:
                store.clear()
            self._slots.clear()
            self._revoked.clear()
            self._resets.clear()
