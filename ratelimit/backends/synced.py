"""``sync_rate > 0`` (Kong's local counters): decide in-process, sync with the store in the
background.

The store is any :class:`~ratelimit.backends.base.CounterSync`: the Redis script engine
(``counter_sync.lua``, one pipelined round trip) or Postgres (``ratelimit_sync``, one
statement). This module imports neither client.

Decisions run on local window counters: the totals fetched at the last sync plus this
process's own hits since. A background task in the running loop wakes every ``sync_rate``
seconds and, in one round trip whatever the number of keys, pushes the local diffs to the
store and fetches fresh totals. A failed sync is logged, keeps its diffs, and is retried at
the next tick. Decisions between syncs do not see other processes' hits: each process can
admit up to a whole limit per sync interval on its own, which is the price of not asking
the store on every call. Time is the local clock corrected by the offset to the store's
clock (Redis's ``TIME``, the database's ``clock_timestamp()``) measured at each sync, so
windows stay aligned across processes.

The sync task runs in the loop of the latest decision: when one loop ends and another
decides, a new task starts there, and what the old one had not synced is synced by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable

from ratelimit.algorithms import FIXED_WINDOW, SLIDING_WINDOW, US_PER_MS, not_before
from ratelimit.backends.base import (
    NOTHING_TO_SET_UP,
    Clock,
    CounterSync,
    Push,
    SetUpStore,
    SlotStore,
    Totals,
    clock_us,
)
from ratelimit.backends.layout import counter_update_rate, window_name, window_names
from ratelimit.backends.loops import LoopBinding
from ratelimit.core.checks import check_clock, check_sync_seconds
from ratelimit.core.decision import Decision
from ratelimit.core.evaluation import evaluate
from ratelimit.core.plan import CounterUpdate, Identifier, Plan
from ratelimit.core.settling import Settlement
from ratelimit.core.slots import SlotClaim
from ratelimit.errors import ConfigurationError, LimiterClosedError

logger = logging.getLogger("ratelimit")


class _Local:
    """One (identifier, window size): totals fetched at the last sync, hits sent by a sync
    whose reply has not landed yet, and hits since. ``spreads``: whether it may be kept
    under a hash tag of its own (the plan's tree was not compiled pinned: a store that
    spreads syncs it where decisions keep it: :class:`~ratelimit.backends.base.Push`)."""

    __slots__ = ("diff", "identifier", "in_flight", "size", "spreads", "synced", "used_us")

    def __init__(self, identifier: Identifier, size: int, spreads: bool = False) -> None:
        self.identifier = identifier
        self.size = size
        self.spreads = spreads
        self.synced: dict[int, float] = {}
        self.in_flight: dict[int, float] = {}
        self.diff: dict[int, float] = {}
        self.used_us = 0

    def count(self, index: int) -> float:
        count = self.synced.get(index, 0.0) + self.diff.get(index, 0.0)
        return count + self.in_flight.get(index, 0.0) if self.in_flight else count

    def newest(self) -> int:
        """The newest window counted here, or -1."""
        newest = max(self.synced, default=-1)
        newest = max(newest, max(self.diff, default=-1))
        return max(newest, max(self.in_flight, default=-1)) if self.in_flight else newest

    def add(self, index: int, value: float) -> None:
        self.diff[index] = self.diff.get(index, 0.0) + value

    def send(self) -> dict[int, float]:
        """Move the diffs to ``in_flight`` (they still count) and return them."""
        sent, self.diff = self.diff, {}
        for index, value in sent.items():
            self.in_flight[index] = self.in_flight.get(index, 0.0) + value
        return sent

    def landed(self, sent: dict[int, float], synced: dict[int, float] | None) -> None:
        """A sync's reply: ``synced`` (totals that include ``sent``), or ``None`` when it
        failed and ``sent`` goes back to the diffs for the next sync."""
        for index, value in sent.items():
            left = self.in_flight.get(index, 0.0) - value
            if abs(left) < 1e-9:
                self.in_flight.pop(index, None)
            else:
                self.in_flight[index] = left
            if synced is None:
                self.add(index, value)
        if synced is not None:
            self.synced = synced


class SyncedBackend:
    """Local window counters synced with ``remote`` every ``sync_rate`` seconds.

    Built by ``RateLimit(client, algorithm="sliding-window", sync_rate=1.0)`` (and by
    ``RateLimit.from_url("postgresql://...", ...)`` with ``sync_rate``). Call :meth:`sync`
    to sync now; :meth:`aclose` stops the task, syncs a last time and closes ``remote``.
    ``clock`` (seconds) replaces the store's time and ``sleep`` the wait between syncs, for
    tests. Concurrency slots and ``setup`` go to ``remote``, where it has them.
    """

    def __init__(
        self,
        remote: CounterSync,
        sync_rate: float,
        *,
        clock: Clock | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        check_sync_seconds(sync_rate)  # the checks Settings makes of the same settings
        if not sync_rate > 0:  # 0 and below are Settings' other modes, not this backend
            raise ConfigurationError(f"sync_rate must be above 0 here, not {sync_rate!r}")
        check_clock(clock)
        self.remote = remote
        self.sync_rate = sync_rate
        self.clock = clock
        self._sleep = sleep  # how the sync task waits between syncs (tests step it)
        self._offset_us = 0
        self._locals: dict[str, _Local] = {}  # by layout.window_names
        self._lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None
        self._loop = LoopBinding()
        self._closed = False

    def unsynced(self) -> float:
        """Hits counted here that the store has not confirmed yet: waiting for the next sync,
        or sent by one whose reply has not landed."""
        with self._lock:
            return sum(
                sum(local.diff.values()) + sum(local.in_flight.values())
                for local in self._locals.values()
            )

    def _now(self) -> int:
        if self.clock is not None:
            return clock_us(self.clock)
        return time.time_ns() // 1000 + self._offset_us

    def _start(self) -> None:
        """Run the sync task in the running loop. A loop that ended took its task (and any
        sync it had in flight) with it: its diffs are sent by the next sync here."""
        if self._loop.loop is asyncio.get_running_loop() or self._closed:
            return
        if self._loop.moved() and self._task is not None:
            with self._lock:
                for local in self._locals.values():
                    if local.in_flight:
                        local.landed(dict(local.in_flight), None)
        self._task = asyncio.get_running_loop().create_task(self._run())

    algorithms = frozenset({SLIDING_WINDOW, FIXED_WINDOW})
    """The algorithms this backend decides: the window counters, whose counts merge."""

    async def decide(self, plan: Plan) -> Decision:
        if self._loop.loop is not asyncio.get_running_loop():
            self._start()
        if self._closed:
            raise LimiterClosedError("this synced backend")
        with self._lock:
            now = self._now()
            if len(plan.compiled.rules) == 1 and plan.identifiers:
                return self._decide_one(plan, now)
            return self._decide_tree(plan, now)

    def _decide_tree(self, plan: Plan, now: int) -> Decision:
        """Every leaf's local counters, then the hit added to each when admitted."""
        known = self._locals
        entries = [[known.get(name) for name in names] for names in window_names(plan)]
        for found in entries:  # a window newer than now: the clock stepped back
            for local in found:
                if local is not None:
                    now = not_before(now, local.newest(), local.size)
        counts: list[tuple[float, float]] = []
        for rule, i, w in zip(
            plan.compiled.rules, plan.leaf_identifiers, plan.leaf_windows, strict=True
        ):
            local = entries[i][w] if i >= 0 else None
            if local is None:
                counts.append((0.0, 0.0))
                continue
            index = now // (rule.span_ms * US_PER_MS)
            counts.append((local.count(index), local.count(index - 1)))
        decision = evaluate(plan, now, counts)
        for i, (names, found) in enumerate(zip(window_names(plan), entries, strict=True)):
            for w, local in enumerate(found):
                if local is None:
                    local = known[names[w]] = _Local(
                        plan.identifiers[i], plan.windows[i][w], not plan.compiled.pinned
                    )
                local.used_us = now
                if decision.allowed and plan.record:
                    local.add(now // local.size, plan.identifier_cost(i))
        return decision

    def _decide_one(self, plan: Plan, now: int) -> Decision:
        """:meth:`_decide_tree` for the common single rule with a value: one counter, no
        tree (``bench/fast_paths.py`` measures what it saves)."""
        name = window_names(plan)[0][0]
        local = self._locals.get(name)
        size = plan.windows[0][0]
        if local is not None:  # a window newer than now: the clock stepped back
            now = not_before(now, local.newest(), size)
        index = now // size
        counts = [(local.count(index), local.count(index - 1)) if local else (0.0, 0.0)]
        decision = evaluate(plan, now, counts)
        if local is None:
            local = self._locals[name] = _Local(plan.identifiers[0], size, not plan.compiled.pinned)
        local.used_us = now
        if decision.allowed and plan.record:
            local.add(index, plan.cost)
        return decision

    async def settle(self, settlement: Settlement) -> None:
        """Settle on the local counters (synced as any hit): a refund from the window the
        call was counted in, never below what is counted there; an excess now."""
        if self._closed:
            raise LimiterClosedError("this synced backend")
        plan = settlement.plan
        with self._lock:
            now = self._now()
            todo: dict[str, tuple[int, int, float]] = {}
            leaves = zip(plan.leaf_windows, plan.leaf_identifiers, settlement.deltas, strict=True)
            for w, k, delta in leaves:
                if k >= 0 and delta:
                    todo.setdefault(window_names(plan)[k][w], (k, plan.windows[k][w], delta))
            for name, (_, size, _) in todo.items():  # the clock stepped back
                local = self._locals.get(name)
                if local is not None:
                    now = not_before(now, local.newest(), size)
            for name, (k, size, delta) in todo.items():
                local = self._locals.get(name)
                if delta < 0:
                    at = settlement.at_us // size
                    if local is not None:
                        local.add(at, -min(-delta, local.count(at)))
                    continue
                if local is None:
                    local = self._locals[name] = _Local(
                        plan.identifiers[k], size, not plan.compiled.pinned
                    )
                local.used_us = now
                local.add(now // size, delta)

    @property
    def syncing(self) -> bool:
        """Whether a sync task is running (from the first decision until :meth:`aclose`)."""
        return self._task is not None and not self._task.done()

    @property
    def holds_slots(self) -> bool:
        """Whether its remote store holds concurrency slots (Redis does, Postgres not)."""
        return isinstance(self.remote, SlotStore)

    def _slots(self) -> SlotStore:
        if not isinstance(self.remote, SlotStore):
            raise ConfigurationError(f"{type(self.remote).__name__} holds no concurrency slots")
        return self.remote

    async def acquire_slots(self, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
        """Concurrency slots are never local: the remote store holds them."""
        return await self._slots().acquire_slots(claim)

    async def renew_slots(self, claim: SlotClaim) -> bool:
        return await self._slots().renew_slots(claim)

    async def release_slots(self, claim: SlotClaim, *, revoke: bool = False) -> None:
        await self._slots().release_slots(claim, revoke=revoke)

    async def setup(self) -> str:
        """Set the remote store up, if it needs it (Postgres): see ``RateLimit.setup``."""
        if isinstance(self.remote, SetUpStore):
            return await self.remote.setup()
        return NOTHING_TO_SET_UP

    async def reset(self, plan: Plan) -> None:
        if self._closed:
            raise LimiterClosedError("this synced backend")
        with self._lock:
            for names in window_names(plan):
                for name in names:
                    self._locals.pop(name, None)
        await self.remote.reset(plan)

    async def update_counter(self, update: CounterUpdate) -> float:
        if self._closed:
            raise LimiterClosedError("this synced backend")
        self._start()
        with self._lock:
            now = self._now()
            name = window_name(update.identifier, update.size_us)
            local = self._locals.get(name)
            if local is None:
                local = self._locals[name] = _Local(update.identifier, update.size_us)
            now = not_before(now, local.newest(), update.size_us)
            local.used_us = now
            index = now // update.size_us
            rate = counter_update_rate(update, local.count(index), local.count(index - 1), now)
            if update.value:
                local.add(index, update.value)
            return rate

    async def sync(self) -> None:
        """Push every local diff and fetch fresh totals, in one round trip. On failure the
        diffs stay for the next sync and the error is raised: a ``BackendError``, or
        ``LimiterClosedError`` once the store was closed (:meth:`aclose` closes it).

        The diffs sent keep counting locally until the reply lands (the store's totals then
        include them), so hits made while a sync is in flight are never out of sight."""
        with self._lock:
            now = self._now()
            # per identifier and layout: one push each (one identifier's sizes share one)
            taken: dict[tuple[Identifier, bool], list[tuple[_Local, dict[int, float]]]] = {}
            for name, local in list(self._locals.items()):
                idle = not local.diff and not local.in_flight
                if idle and now - local.used_us > 2 * local.size:
                    del self._locals[name]  # unused for two windows: forget it
                    continue
                by = (local.identifier, local.spreads)
                taken.setdefault(by, []).append((local, local.send()))
        if not taken:
            return
        pushes: list[Push] = []
        for (identifier, spreads), sizes in taken.items():
            entries = []
            for local, sent in sizes:  # every size is named, so every size gets its totals
                size = local.size
                entries += [(size, i, d) for i, d in sent.items()] or [(size, now // size, 0.0)]
            pushes.append(Push(identifier, entries, spreads))
        sent_us = time.time_ns() // 1000
        try:
            server_now, results = await self.remote.sync_counters(pushes)
        except BaseException:
            self._landed(taken.values(), None)
            raise
        received_us = time.time_ns() // 1000
        for ((identifier, _), sizes), result in zip(taken.items(), results, strict=True):
            if isinstance(result, Exception):
                logger.warning("ratelimit: sync of %r failed, retrying: %s", identifier, result)
                self._landed([sizes], None)
            else:
                self._landed([sizes], result)
        if server_now is not None and self.clock is None:
            self._offset_us = server_now - (sent_us + received_us) // 2

    def _landed(
        self,
        taken: Iterable[list[tuple[_Local, dict[int, float]]]],
        totals: Totals | None,
    ) -> None:
        with self._lock:
            for sizes in taken:
                for local, sent in sizes:
                    local.landed(sent, None if totals is None else totals.get(local.size, {}))

    async def _run(self) -> None:
        # Checked as well as cancelled: redis-py can swallow a cancellation that lands
        # mid-read, and aclose() would then wait for this loop forever.
        while not self._closed:
            await self._sleep(self.sync_rate)  # the sync interval itself
            if self._closed:
                return  # closed meanwhile: aclose made the last sync, and closed the store
            try:
                await self.sync()
            except Exception as exc:  # logged, diffs kept, next tick tries again
                logger.warning("ratelimit: sync failed, keeping local diffs: %s", exc)

    async def aclose(self) -> None:
        """Stop the sync task, push what is left (best effort), close the remote."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None and self._loop.loop is asyncio.get_running_loop():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.sync()
        except Exception as exc:
            logger.warning("ratelimit: last sync before closing failed: %s", exc)
        await self.remote.aclose()
