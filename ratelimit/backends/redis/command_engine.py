"""The Redis backend's command engine (``use_scripts=False``): plain commands, no Lua at all.

For Redis-compatible servers and proxies that refuse scripts. Per decision, under a lock per
(namespace, key) (see :mod:`ratelimit.backends.redis.lock`) unless ``disable_locks``:

1. one pipeline reads ``TIME``, the newest entries of every log (up to 64, ``LRANGE``), their
   ``PTTL``, the largest count kept on each (its ``:n`` companion), and ``LINDEX count-1``
   for rules whose count is beyond what was read (on a cluster, ``TIME`` goes separately to
   the node that owns the slot);
2. the tree is evaluated in Python by the same code as every other backend; a second read
   (``LRANGE``) is needed only when a rule of count > 64 has more than 64 hits in its window
   without being limited;
3. if allowed, one ``MULTI`` does ``LPUSH`` / ``LTRIM`` / ``PEXPIRE`` on every identifier (a
   log is trimmed to the largest count any limit on it asked to keep, which its companion
   remembers);
4. the lock is released.

Decisions equal the script engine's, ``retry_after`` and ``remaining`` included. Without the
lock, concurrent decisions on one key can read the same state and all be admitted: a bounded
overshoot of at most the number of decisions in flight at once.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ratelimit import windows
from ratelimit.algorithms import (
    GCRA,
    SLIDING_LOG,
    US_PER_MS,
    Arrival,
    gcra_burst,
    gcra_next,
    not_before,
    window,
    window_index,
)
from ratelimit.backends.base import Clock, clock_us
from ratelimit.backends.redis import command_slots
from ratelimit.backends.redis.client import RedisClient, check_transactions, close_client
from ratelimit.backends.redis.compat import CLUSTERS, ConnectionError, OutOfMemoryError
from ratelimit.backends.redis.connections import ConnectionGate, forget_other_loops_of
from ratelimit.backends.redis.errors import mapped
from ratelimit.backends.redis.keys import (
    arrival_keys,
    counter_key,
    identifier_key,
    kept_key,
    lock_key,
    plan_keys,
    slot_fields,
    window_fields,
)
from ratelimit.backends.redis.lock import SETTLE_TIMEOUT, Blocking, RedisLock, settle
from ratelimit.decision import Decision
from ratelimit.errors import BackendError, ConfigurationError, LimiterClosedError
from ratelimit.evaluation import evaluate
from ratelimit.loops import LoopBinding
from ratelimit.plan import (
    CounterUpdate,
    Plan,
    arrival_slots,
    counter_update_rate,
    limits_per_identifier,
)
from ratelimit.slots import SlotClaim

HEAD = 64  # entries of each log read in the first round trip
INJECTED_CLOCK_KEEP_US = 3_600_000_000
"""GCRA under an injected clock (tests): Redis expires keys on real time, not on that clock,
so an arrival time is kept an hour at least (``gcra.lua`` does the same)."""
T = TypeVar("T")


class RedisCommandBackend:
    """Decides plans with plain Redis commands, under a Redis lock unless ``disable_locks``.

    ``lock_ttl`` bounds how long a crashed holder blocks others; waiters are woken by the
    holder's release (see :mod:`~ratelimit.backends.redis.lock`), and poll every
    ``lock_polling_interval`` (±50 % jitter) only where they cannot block; ``lock_timeout``
    is how long a decision waits for the lock before
    :class:`~ratelimit.errors.LockTimeoutError`, which the failure policy answers with a
    refusal (or raises, under ``on_error="raise"``). Waiting never admits, and is not part
    of the ``timeout`` of the decision's round trips.

    Example::

        rl = RateLimit(redis.asyncio.Redis(), use_scripts=False)   # builds this backend
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        clock: Clock | None = None,
        disable_locks: bool = False,
        lock_ttl: float = 10.0,
        lock_polling_interval: float = 0.1,
        lock_timeout: float = 10.0,
        owns_client: bool = False,
        timeout: float | None = None,
    ) -> None:
        for name, value in (
            ("lock_ttl", lock_ttl),
            ("lock_polling_interval", lock_polling_interval),
        ):
            if not value > 0:
                raise ConfigurationError(
                    f"{name} must be a positive number of seconds, not {value!r}"
                )
        if not lock_timeout >= 0:
            raise ConfigurationError(
                f"lock_timeout must be 0 or more seconds, not {lock_timeout!r}"
            )
        check_transactions(client)
        self.client = client
        self.clock = clock
        self._owns_client = owns_client
        self.disable_locks = disable_locks
        self.lock_ttl = lock_ttl
        self.lock_polling_interval = lock_polling_interval
        self.lock_timeout = lock_timeout
        self.timeout = timeout
        self._closed = False
        self._loop = LoopBinding()
        self._gate = ConnectionGate(client)  # never more commands at once than connections
        self._blocking = Blocking(self._gate)
        self._locks: weakref.WeakValueDictionary[str, RedisLock] = weakref.WeakValueDictionary()
        self._lock_tasks: set[asyncio.Future[Any]] = set()  # what the locks run apart

    def lock(self, namespace: str, key: str) -> RedisLock:
        """The lock guarding every identifier of one (namespace, key): one object per key
        while this process uses it, so that its callers queue in the process."""
        name = lock_key(namespace, key)
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = RedisLock(
                self.client,
                name,
                ttl=self.lock_ttl,
                polling_interval=self.lock_polling_interval,
                timeout=self.lock_timeout,
                round_trip_timeout=self.timeout,
                gate=self._gate,
                blocking=self._blocking,
                tasks=self._lock_tasks,
            )
        return lock

    async def decide(self, plan: Plan) -> Decision:
        if not plan.identifiers:
            return evaluate(plan, 0, [(0, 0)] * len(plan.compiled.rules))
        return await self._guarded(
            plan.namespace,
            plan.key,
            lambda: self._decide(plan),
            f"decide key {plan.key!r}",
            refuse_only=lambda: self._decide(plan, may_write=False),
        )

    async def _guarded(
        self,
        namespace: str,
        key: str,
        work: Callable[[], Awaitable[T]],
        what: str,
        refuse_only: Callable[[], Awaitable[T]] | None = None,
        always_lock: bool = False,
    ) -> T:
        """Run ``work`` under the lock of (namespace, key) unless ``disable_locks`` (and
        not ``always_lock``: concurrency slots are a hard cap, never overshot), with
        Redis errors raised as ``BackendError``.

        Each step is sent once; redis-py's own retry (the client's ``retry=``) may resend a
        command after a dropped connection, so a hit can then count twice (refusing sooner,
        never admitting more). When Redis refuses writes (``maxmemory`` with
        ``noeviction``: the lock's ``SET`` fails too), ``refuse_only`` decides without the
        lock: a refusal needs no write, and an admission it cannot record fails."""
        if self._closed:
            raise LimiterClosedError("this Redis backend")
        if self._loop.loop is not asyncio.get_running_loop():
            self._bind()
        # A LockTimeoutError is contention, not an outage: mapped() lets it through.
        with mapped(f"to {what}", self.timeout):
            try:
                return await self._once(namespace, key, work, always_lock)
            except OutOfMemoryError:
                if refuse_only is None:
                    raise
                async with self._gate.slot(), asyncio.timeout(self.timeout):
                    return await refuse_only()

    async def _once(
        self, namespace: str, key: str, work: Callable[[], Awaitable[T]], locked: bool = False
    ) -> T:
        if self.disable_locks and not locked:
            async with self._gate.slot():  # waiting for a connection is not an outage
                async with asyncio.timeout(self.timeout):
                    return await work()
        async with self.lock(namespace, key).held(), self._gate.slot():
            async with asyncio.timeout(self.timeout):  # the lock's wait is not an outage
                return await work()

    async def acquire_slots(self, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
        return await self._guarded(
            claim.namespace,
            claim.key,
            lambda: command_slots.acquire(self, claim),
            "take a slot",
            always_lock=True,
        )

    async def renew_slots(self, claim: SlotClaim) -> bool:
        return await self._guarded(
            claim.namespace,
            claim.key,
            lambda: command_slots.renew(self, claim),
            "renew a slot",
            always_lock=True,
        )

    async def release_slots(self, claim: SlotClaim, *, revoke: bool = False) -> None:
        await self._guarded(
            claim.namespace,
            claim.key,
            lambda: command_slots.release(self, claim, revoke),
            "give a slot back",
            always_lock=True,
        )

    async def reset(self, plan: Plan) -> None:
        keys = plan_keys(plan)
        if keys:
            await self._guarded(
                plan.namespace, plan.key, lambda: self.client.delete(*keys), "reset"
            )

    async def update_counter(self, update: CounterUpdate) -> float:
        identifier = update.identifier
        return await self._guarded(
            identifier.namespace,
            identifier.key,
            lambda: self._update_counter(update),
            f"update counter {identifier.key!r}",
        )

    async def _update_counter(self, update: CounterUpdate) -> float:
        key = counter_key(update.identifier)
        size = update.size_us

        def fill(read: Any) -> None:
            read.hmget(key, window_fields(size))
            read.pttl(key)

        replies = await self._read(fill)
        now = await self._now(replies, key)
        fields, ttl = replies
        now = not_before(now, windows.newest(fields), size)  # the clock stepped back
        index = window_index(now, size)
        current, previous = windows.counted(fields, index)
        rate = counter_update_rate(update, current, previous, now)
        if update.value:
            write = self.client.pipeline(transaction=True)
            count, held = slot_fields(size, index)
            write.hset(key, mapping={count: repr(current + update.value), held: index})
            if int(ttl) < math.ceil(2 * size / 1000):
                write.pexpire(key, math.ceil(2 * size / 1000))
            await write.execute()
        return rate

    async def _now(self, replies: list[Any], key: str) -> int:
        """The decision's time: the injected clock, else Redis TIME (first in ``replies``,
        or, on a cluster, asked of the node that owns ``key``)."""
        if self.clock is not None:
            return clock_us(self.clock)
        if isinstance(self.client, CLUSTERS):  # a cluster pipeline cannot route TIME
            node = self.client.get_node_from_key(key)
            seconds, micros = await self.client.execute_command("TIME", target_nodes=node)
        else:
            seconds, micros = replies.pop(0)
        return int(seconds) * 1_000_000 + int(micros)

    async def _read(self, fill: Callable[[Any], None]) -> list[Any]:
        """Run the reads ``fill`` adds to a pipeline, after ``TIME`` (unless a clock is
        injected, or on a cluster). Sent again once after a dropped connection (a Redis
        restart): reads change nothing. Writes are never sent again."""

        def reads() -> Any:
            read = self.client.pipeline(transaction=False)
            if self.clock is None and not isinstance(self.client, CLUSTERS):
                read.time()
            fill(read)
            return read

        try:
            replies: list[Any] = await reads().execute()
        except ConnectionError:
            replies = await reads().execute()
        return replies

    async def _decide(self, plan: Plan, may_write: bool = True) -> Decision:
        if plan.algorithm == GCRA:
            return await self._decide_arrivals(plan, may_write)
        if plan.algorithm != SLIDING_LOG:
            return await self._decide_windows(plan, may_write)
        keys = [identifier_key(identifier) for identifier in plan.identifiers]
        kept_keys = [kept_key(identifier) for identifier in plan.identifiers]
        limits = limits_per_identifier(plan)
        rules = plan.compiled.rules
        deep = [
            (leaf, i)
            for leaf, (rule, i) in enumerate(zip(rules, plan.leaf_identifiers, strict=True))
            if i >= 0 and plan.depth(leaf) > HEAD
        ]

        def fill(read: Any) -> None:
            for key, kept, (keep, _span) in zip(keys, kept_keys, limits, strict=True):
                read.lrange(key, 0, min(keep, HEAD) - 1)
                read.pttl(key)
                read.get(kept)
            for leaf, i in deep:
                read.lindex(keys[i], plan.depth(leaf) - 1)

        replies = await self._read(fill)
        now = await self._now(replies, keys[0])
        heads = [[int(t) for t in replies[3 * i]] for i in range(len(keys))]
        ttls = [int(replies[3 * i + 1]) for i in range(len(keys))]
        held = [int(replies[3 * i + 2] or 0) for i in range(len(keys))]
        nth = {leaf: replies[3 * len(keys) + n] for n, (leaf, _i) in enumerate(deep)}

        counts: list[tuple[int, int]] = []
        for leaf, (rule, i) in enumerate(zip(rules, plan.leaf_identifiers, strict=True)):
            if i < 0:
                counts.append((0, 0))
                continue
            threshold = now - rule.span_ms * US_PER_MS
            counts.append(
                await self._window(keys[i], heads[i], nth.get(leaf), plan.depth(leaf), threshold)
            )
        decision = evaluate(plan, now, counts)
        if decision.allowed and plan.record:
            if not may_write:
                raise _cannot_record(plan)
            write = self.client.pipeline(transaction=True)
            for k, (key, kept, head, ttl, count, (keep, span_ms)) in enumerate(
                zip(keys, kept_keys, heads, ttls, held, limits, strict=True)
            ):
                stamp = max(now, head[0]) if head else now
                for left in range(min(int(plan.identifier_cost(k)), keep), 0, -1000):
                    write.lpush(key, *[stamp] * min(left, 1000))
                # never below what another limit on this log asked to keep
                write.ltrim(key, 0, max(keep, count) - 1)
                extended = ttl < span_ms  # then two spans, as the script does
                if extended:
                    ttl = 2 * span_ms
                    write.pexpire(key, ttl)
                if keep > count:
                    write.set(kept, keep, px=ttl)
                elif extended:
                    write.pexpire(kept, ttl)
            await write.execute()
        return decision

    async def _decide_windows(self, plan: Plan, may_write: bool = True) -> Decision:
        """Sliding or fixed window: the same counters as ``window_counters.lua``."""
        keys = [counter_key(identifier) for identifier in plan.identifiers]
        sizes = plan.windows

        def fill(read: Any) -> None:
            for key, sizes_of in zip(keys, sizes, strict=True):
                for size in sizes_of:
                    read.hmget(key, window_fields(size))
                read.pttl(key)

        replies = await self._read(fill)
        now = await self._now(replies, keys[0])
        fields: list[dict[int, Sequence[Any]]] = []  # per key, per size: its four fields
        ttls: list[int] = []
        for sizes_of in sizes:
            fields.append({size: replies.pop(0) for size in sizes_of})
            ttls.append(int(replies.pop(0)))
        for by_size in fields:  # a window newer than now: the clock stepped back
            for size, four in by_size.items():
                now = not_before(now, windows.newest(four), size)
        held = [  # per key, per size: (current, previous)
            {size: windows.counted(four, window_index(now, size)) for size, four in by_size.items()}
            for by_size in fields
        ]
        counts = [
            (0.0, 0.0) if i < 0 else held[i][rule.span_ms * US_PER_MS]
            for rule, i in zip(plan.compiled.rules, plan.leaf_identifiers, strict=True)
        ]
        decision = evaluate(plan, now, counts)
        if decision.allowed and plan.record:
            if not may_write:
                raise _cannot_record(plan)
            write = self.client.pipeline(transaction=True)
            for k, (key, counted, ttl) in enumerate(zip(keys, held, ttls, strict=True)):
                cost = plan.identifier_cost(k)
                for size, (current, _previous) in counted.items():
                    index = window_index(now, size)
                    count, held_index = slot_fields(size, index)
                    write.hset(key, mapping={count: repr(current + cost), held_index: index})
                ms = math.ceil(2 * max(counted) / 1000)
                if ttl < ms:
                    write.pexpire(key, ms)
            await write.execute()
        return decision

    async def _decide_arrivals(self, plan: Plan, may_write: bool = True) -> Decision:
        """GCRA: the same arrival times as ``gcra.lua``, one string per (identifier, rule
        shape)."""
        keys = arrival_keys(plan)
        times, slots = arrival_slots(plan.compiled, plan.leaf_identifiers)
        replies = await self._read(lambda read: read.mget(keys))
        now = await self._now(replies, keys[0])
        stored = [_arrival(value) for value in replies[0]]
        counts: list[Arrival] = [(0, 0) if k < 0 else stored[k] for k in slots]
        decision = evaluate(plan, now, counts)
        if decision.allowed and plan.record:
            if not may_write:
                raise _cannot_record(plan)
            write = self.client.pipeline(transaction=True)
            for key, (i, rule), tat in zip(keys, times, stored, strict=True):
                pushed = gcra_next(rule, plan.identifier_cost(i), tat, now)
                keep = pushed[0] - now + 1
                if self.clock is not None:  # Redis expires on real time, not on this clock
                    tolerance_us = gcra_burst(rule) * rule.span_ms * US_PER_MS // rule.count
                    keep = max(keep, tolerance_us + 1, INJECTED_CLOCK_KEEP_US)
                write.set(key, _arrival_text(pushed), px=math.ceil(keep / 1000))
            await write.execute()
        return decision

    async def _window(
        self, key: str, head: Sequence[int], nth: bytes | None, count: int, threshold: int
    ) -> tuple[int, int]:
        """``window()`` over the newest ``count`` entries of a log (a rule's depth), reading
        past the head of the log only when it must."""
        if count <= HEAD or len(head) < HEAD:
            return window(head, count, threshold)
        if nth is not None and int(nth) > threshold:
            return count, int(nth)
        counted = window(head, HEAD, threshold)
        if counted[0] < HEAD:
            return counted  # an old entry within the head ends the window
        rest = [int(t) for t in await self.client.lrange(key, HEAD, count - 1)]
        return window([*head, *rest], count, threshold)

    def _bind(self) -> None:
        """Work in the running loop: connections an ended loop opened are opened anew."""
        if self._loop.moved():
            forget_other_loops_of(self.client)
            self._gate = ConnectionGate(self.client)  # its futures served the old loop
            self._blocking = Blocking(self._gate)
            self._locks = weakref.WeakValueDictionary()
            self._lock_tasks = set()  # the old loop's ended with it

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loop.loop is not None and self._loop.loop is not asyncio.get_running_loop():
            self._bind()
        # give-backs of locks whose callers left finish first; nothing is left pending
        await settle(self._lock_tasks, self._blocking, self.timeout or SETTLE_TIMEOUT)
        if self._owns_client:
            await close_client(self.client)


def _arrival(stored: bytes | str | None) -> Arrival:
    """A stored arrival time, ``us`` or ``us:rem`` (``gcra.lua`` writes the same)."""
    if stored is None:
        return (0, 0)
    text = stored.decode() if isinstance(stored, bytes) else stored
    us, _, remainder = text.partition(":")
    return int(us), int(remainder or 0)


def _arrival_text(arrival: Arrival) -> str:
    return f"{arrival[0]}:{arrival[1]}" if arrival[1] else str(arrival[0])


def _cannot_record(plan: Plan) -> BackendError:
    return BackendError(
        f"redis refuses writes (maxmemory with noeviction): the hit of key {plan.key!r} "
        "cannot be recorded"
    )
