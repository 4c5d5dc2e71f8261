"""The in-process backend (``memory://``): the Redis scripts' logs, counters and arrival
times, in dicts.

Decisions in one process only; nothing is shared with other processes. Safe for many
coroutines and threads at once (a decision takes no await between counting and recording).
Identifiers whose data have expired are swept away, so memory follows the live identifiers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from ratelimit.algorithms import (
    FIXED_WINDOW,
    GCRA,
    SLIDING_LOG,
    SLIDING_WINDOW,
    US_PER_MS,
    Algorithm,
    Arrival,
    gcra_rescaled,
    gcra_shared_next,
    log_outcome,
    not_before,
    window,
    window_index,
)
from ratelimit.backends import windows
from ratelimit.backends.base import Clock, clock_us
from ratelimit.backends.layout import (
    arrival_shapes,
    arrival_slots,
    counter_update_rate,
    limits_per_identifier,
    reset_keep_us,
)
from ratelimit.backends.memory.admit import Admit, AdmitIdentified, admitter, identified
from ratelimit.backends.memory.entries import Arrivals, Log, Windows
from ratelimit.backends.memory.overrides import OverrideTables
from ratelimit.backends.memory.penalties import PenaltyTables
from ratelimit.backends.memory.settles import SettleTables
from ratelimit.core.checks import check_clock
from ratelimit.core.decision import Decision
from ratelimit.core.evaluation import decided, evaluate
from ratelimit.core.plan import CompiledTree, CounterUpdate, Identifier, Plan
from ratelimit.core.settling import Settlement
from ratelimit.core.slots import SlotClaim
from ratelimit.errors import LimiterClosedError


class MemoryBackend(OverrideTables, SettleTables, PenaltyTables):
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

    def _decide_log(self, plan: Plan, now: int) -> Decision:
        """Sliding log: one rule by the shortcut, a tree by the general path."""
        if len(plan.leaf_identifiers) == 1 and plan.identifiers:
            return self._decide_one(plan, now)
        return self._decide_logs(plan, now)

    def _decide_logs(self, plan: Plan, now: int) -> Decision:
        """Sliding logs: every leaf of the tree counted, then recorded when admitted."""
        logs = [self._live(identifier, now) for identifier in plan.identifiers]
        counts: list[tuple[int, int]] = []
        rules = plan.compiled.rules
        for leaf, (rule, i) in enumerate(zip(rules, plan.leaf_identifiers, strict=True)):
            if i < 0:
                counts.append((0, 0))
            else:
                threshold = now - rule.span_ms * US_PER_MS
                counts.append(window(logs[i].hits, plan.depth(leaf), threshold))
        decision = evaluate(plan, now, counts)
        if decision.allowed and plan.record:
            over = [False] * len(logs)  # a rule of the log over its count: see Log.record
            for leaf, (i, (hits, _)) in enumerate(zip(plan.leaf_identifiers, counts, strict=True)):
                if i >= 0 and hits >= plan.depth(leaf):
                    over[i] = True
            for k, (identifier, log, (keep, span_ms)) in enumerate(
                zip(plan.identifiers, logs, limits_per_identifier(plan), strict=True)
            ):
                cost = int(plan.identifier_cost(k))
                log.record(now, cost, keep, span_ms * US_PER_MS, over[k])
                self._logs[identifier] = log
        return decision

    def _decide_one(self, plan: Plan, now: int) -> Decision:
        """A single rule on a sliding log: what :meth:`_decide_logs` does, without the tree
        (1.5x the decisions per second in memory; ``bench/fast_paths.py`` measures it)."""
        identifier = plan.identifiers[0]
        rule = plan.compiled.rules[0]
        log = self._logs.get(identifier)
        if log is None or log.expires_us <= now:
            log = self._logs[identifier] = Log()  # an unrecorded one is swept when expired
        span_us = rule.span_ms * US_PER_MS
        counted = window(log.hits, rule.count - int(plan.cost) + 1, now - span_us)
        decision = decided(plan, log_outcome(rule, 0, plan.cost, counted, now), now, (counted,))
        if decision.allowed and plan.record:
            log.record(now, int(plan.cost), rule.count, span_us)
        return decision

    def _decide_windows(self, plan: Plan, now: int) -> Decision:
        entries = []
        for identifier in plan.identifiers:
            entry = self._windows.get(identifier)
            entries.append(entry if entry is not None and entry.expires_us > now else Windows())
        for rule, i in zip(plan.compiled.rules, plan.leaf_identifiers, strict=True):
            if i >= 0:  # a window newer than now: the clock stepped back
                size = rule.span_ms * US_PER_MS
                now = not_before(now, entries[i].newest(size), size)
        counts: list[tuple[float, float]] = []
        for rule, i in zip(plan.compiled.rules, plan.leaf_identifiers, strict=True):
            size = rule.span_ms * US_PER_MS
            counts.append((0.0, 0.0) if i < 0 else entries[i].counted(size, now // size))
        decision = evaluate(plan, now, counts)
        if decision.allowed and plan.record:
            sizes = plan.windows
            for k, (identifier, entry, sizes_of) in enumerate(
                zip(plan.identifiers, entries, sizes, strict=True)
            ):
                cost = plan.identifier_cost(k)
                for size in sizes_of:
                    index = window_index(now, size)
                    current, _ = entry.counted(size, index)
                    entry.hold(size, index, current + cost)
                entry.expires_us = max(entry.expires_us, now + 2 * max(sizes_of))
                self._windows[identifier] = entry
        return decision

    def _decide_arrivals(self, plan: Plan, now: int) -> Decision:
        """GCRA: every leaf's arrival time read, then pushed on when admitted."""
        entries = []
        for identifier in plan.identifiers:
            entry = self._arrivals.get(identifier)
            entries.append(entry if entry is not None and entry.expires_us > now else Arrivals())
        times, slots = arrival_slots(plan.compiled, plan.leaf_identifiers)
        stored = [entries[i].stored(field, rule) for i, rule, field in times]
        counts: list[Arrival] = [
            (0, 0) if k < 0 else gcra_rescaled(rule, *stored[k], now)
            for rule, k in zip(plan.compiled.rules, slots, strict=True)
        ]
        decision = evaluate(plan, now, counts)
        if plan.record:
            shapes = arrival_shapes(plan.compiled, plan.leaf_identifiers)
            for (i, rule, field), (tat, count), of in zip(times, stored, shapes, strict=True):
                entry = entries[i]
                if decision.allowed:
                    cost = plan.identifier_cost(i)
                    entry.write(field, rule, gcra_shared_next(of, cost, tat, count, now))
                elif count != rule.count:  # held as this rule reads it: gcra.lua
                    entry.write(field, rule, gcra_rescaled(rule, tat, count, now))
                else:
                    continue
                self._arrivals[plan.identifiers[i]] = entry
        return decision

    async def acquire_slots(self, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
        self._check_open()
        with self._lock:
            now = clock_us(self._clock)
            held = []
            for identifier in claim.identifiers:
                holders = self._slots.get(identifier, {})
                for token in [t for t, ends in holders.items() if ends <= now]:
                    del holders[token]
                held.append(len(holders))
            if self._revoked.get((claim.namespace, claim.key, claim.token), 0) > now or any(
                n >= count for n, count in zip(held, claim.counts, strict=True)
            ):
                return False, tuple(held)
            for identifier in claim.identifiers:
                self._slots.setdefault(identifier, {})[claim.token] = now + claim.lease_us
            return True, tuple(held)

    async def renew_slots(self, claim: SlotClaim) -> bool:
        self._check_open()
        with self._lock:
            now = clock_us(self._clock)
            kept = True
            for identifier in claim.identifiers:
                holders = self._slots.get(identifier, {})
                if claim.token in holders:
                    holders[claim.token] = now + claim.lease_us
                else:
                    kept = False
            return kept

    async def release_slots(self, claim: SlotClaim, *, revoke: bool = False) -> None:
        self._check_open()
        with self._lock:
            if revoke:
                until = clock_us(self._clock) + claim.lease_us
                self._revoked[(claim.namespace, claim.key, claim.token)] = until
            for identifier in claim.identifiers:
                holders = self._slots.get(identifier)
                if holders is not None:
                    holders.pop(claim.token, None)
                    if not holders:
                        del self._slots[identifier]

    def _check_open(self) -> None:
        if self._closed:
            raise LimiterClosedError("this memory backend")

    async def reset(self, plan: Plan) -> None:
        if self._closed:
            raise LimiterClosedError("this memory backend")
        with self._lock:
            now = clock_us(self._clock)
            keep = now + reset_keep_us(plan)
            for identifier in plan.identifiers:
                # kept as long as what it forgot would have been, whatever rules wrote it
                # (a refund takes only from what is held), and as an earlier mark was
                until = max(keep, self._resets.get(identifier, (0, 0))[1])
                for store in self._stores:
                    entry = store.pop(identifier, None)
                    if entry is not None:
                        until = max(until, entry.expires_us)
                self._resets[identifier] = (now, until)

    async def settle(self, settlement: Settlement) -> None:
        self._check_open()
        if settlement.empty:
            return
        with self._lock:
            now = clock_us(self._clock)
            self._SETTLE[settlement.plan.algorithm.name](self, settlement, now)

    _DECIDE: ClassVar[dict[str, Callable[[MemoryBackend, Plan, int], Decision]]] = {
        SLIDING_LOG: _decide_log,
        SLIDING_WINDOW: _decide_windows,
        FIXED_WINDOW: _decide_windows,
        GCRA: _decide_arrivals,
    }
    algorithms: ClassVar[frozenset[str]] = frozenset(_DECIDE)
    """The algorithms this backend decides: each one's code, by name, in ``_DECIDE``."""
    holds_slots: ClassVar[bool] = True
    """It holds concurrency slots, in this process."""
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
