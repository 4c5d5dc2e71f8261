"""Overrides: the rules of one key replaced at run time for the calls whose selector values
match, kept in the limiter's own store so that every process applies them.

An :class:`Override` names a key, zero or more selector values (``apikey="abc"``) and the
rules that replace the key's own for a call whose values include all of them. None: every
call of the key. When several match one call, the one naming the most values wins, then
the one set last. A call matches on the values its limit resolved for it: those of the
selectors its rules name, and the one a rules mapping is keyed by (``tier``).

Each process reads them from a local copy (:class:`OverrideCache`), which a task of the
limiter keeps up to date while decisions come: every ``override_refresh`` seconds (default
1) it asks the store whether anything changed (one small read a second per busy process;
when something changed, the whole set is read again), and after an interval without
decisions it stops, the next decision reading first. So a change reaches every process's
decisions within that interval and one round trip (at once in the process that made it),
and a busy process's decisions never wait for the store on the copy's account (``timeout``
still bounds them). A lookup is a dictionary read: a key without overrides costs nothing
more, however many other keys have some.

The store keeps, per namespace, a version (bumped by each change) and a table from an
override's identity (:func:`override_id`) to its record (:func:`encode`, stamped with the
version its write made: the store's order, :func:`winner`; the records' own module is
:mod:`ratelimit.overrides.records`); the keys its
limits use are announced in the same table (``key:<key>``, no version bump), so that the
command line can warn of an override for a key nothing limits.

A reading that finds a new version also drops the limiter's cached refusals (its denial
cache), and a reset makes a new version (:meth:`OverrideCache.lift`): so a reset, in any
process, lifts every process's cached refusals within ``override_refresh``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ratelimit.backends.base import OverrideStore
from ratelimit.errors import RateLimitError
from ratelimit.overrides.records import MAX_ANNOUNCED_BYTES as MAX_ANNOUNCED_BYTES
from ratelimit.overrides.records import MAX_TTL as MAX_TTL
from ratelimit.overrides.records import Override as Override
from ratelimit.overrides.records import Values as Values
from ratelimit.overrides.records import announceable as announceable
from ratelimit.overrides.records import check_ttl as check_ttl
from ratelimit.overrides.records import decode as decode
from ratelimit.overrides.records import encode as encode
from ratelimit.overrides.records import override_id as override_id
from ratelimit.overrides.records import values_of as values_of
from ratelimit.overrides.records import winner as winner

logger = logging.getLogger("ratelimit")

REFRESH = 1.0
"""Default seconds between two checks of the store for changed overrides."""
ANNOUNCED = "key:"
"""The prefix of a key's announcement in the store's table (override ids start ``[``)."""
LIFTED = "lifted"
"""The identity :meth:`OverrideCache.lift` deletes (none is kept under it: override ids
start ``[``, announcements ``key:``): a write that only makes a new version."""
MAX_ANNOUNCED = 10_000
"""At most this many keys are announced per process (keys made from requests are many)."""
ANNOUNCE_AGAIN = 86_400.0
"""Seconds after which a process announces its keys again (as it decides them)."""
WARN_EVERY = 60.0
"""Seconds between two warnings of the same unusable override or failing refresh."""

_running_loop = asyncio._get_running_loop
"""The running event loop or ``None``, without raising: on every decision's path."""


class OverrideCache:
    """One limiter's copy of its namespace's overrides, indexed for lookups and kept up to
    date by a task that asks the store every ``refresh`` seconds while decisions come (see
    the module); after an interval without any, it stops.

    Decisions never wait for the store, but the first of the limiter's, or the first after
    an idle interval, which waits for a reading (when it fails, the copy stays and the task
    goes on trying), and, with ``refresh`` 0, every one of them. ``clock``: the
    limiter's injected clock (tests), which then tells the time of day for expiry."""

    __slots__ = (
        "_announced",
        "_announced_since",
        "_changed",
        "_checking",
        "_loop",
        "_pairs",
        "_task",
        "_wall",
        "_warned",
        "_whole",
        "failing",
        "keys",
        "known",
        "namespace",
        "pending",
        "read",
        "refresh",
        "sleep",
        "store",
        "used",
        "version",
    )

    def __init__(
        self,
        store: OverrideStore,
        namespace: str,
        refresh: float,
        clock: Callable[[], float] | None,
        failing: Callable[[], bool] = lambda: False,
        changed: Callable[[], object] = lambda: None,
    ) -> None:
        self.store = store
        self._changed = changed
        self.failing = failing
        """Whether the decisions find their store failing now (the failure policy's)."""
        self.namespace = namespace
        self.refresh = refresh
        self._wall = clock or time.time
        self.read = False
        """Whether a first reading was tried (decisions wait for none after it)."""
        self.used = False
        """Whether a decision looked since the task last read (an idle task stops)."""
        self.version: int | None = None
        self.keys: dict[str, int] = {}
        """The keys with overrides now: how many index entries each has."""
        self.known: frozenset[str] = frozenset()
        """The keys the store says some process limits."""
        self._whole: dict[str, list[Override]] = {}
        self._pairs: dict[tuple[str, str, str], list[Override]] = {}
        self._announced: set[str] = set()
        self._announced_since = -math.inf
        self.pending: set[str] = set()
        """Keys of this process not yet announced to the store."""
        self._checking: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._warned: dict[object, float] = {}
        self.sleep: Callable[[float], Awaitable[object]] = asyncio.sleep
        """How the task waits between readings (tests step it)."""

    def now(self) -> float:
        """The time of day expiry is measured in (seconds since the epoch)."""
        return self._wall()

    def stale(self) -> bool:
        """Whether a decision must ask the store first: the limiter's first, or every one
        with ``refresh`` 0; also when the task that keeps the copy up to date is not
        running (it is started then in this event loop; a task another loop runs at the
        same time serves this one too)."""
        if not self.read or not self.refresh:
            return True
        loop = self._loop
        return loop is not _running_loop() and (loop is None or not loop.is_running())

    async def current(self) -> None:
        """What a decision does when :meth:`stale`: the first reading (waited for), the
        task started, or (``refresh`` 0) a reading now."""
        loop = asyncio.get_running_loop()
        running = self._loop
        if self.refresh and running is not loop and (running is None or not running.is_running()):
            self._loop = loop
            self._task = loop.create_task(self._refreshing())
        if not self.read or not self.refresh:
            await self.check()

    async def check(self) -> None:
        """Ask the store now (one question at a time: a caller meanwhile waits for the one
        under way in its event loop; another loop's reads on its own). A store that fails
        leaves the copy as it was (logged, at most once a minute); the decisions meet the
        failure on their own."""
        checking = self._checking
        if checking is None or checking.done() or checking.get_loop() is not _running_loop():
            checking = self._checking = asyncio.ensure_future(self._check())
        await asyncio.shield(checking)

    async def _refreshing(self) -> None:
        while True:
            await self.sleep(self.refresh)
            if self._task is not asyncio.current_task():
                return  # another loop's task took over (this loop had stopped running)
            if not self.used:  # idle: no reading until a decision comes, which reads first
                self.read = False
                self._loop = self._task = None
                return
            self.used = False
            await self.check()

    async def announce(self) -> None:
        """Tell the store the keys this process decided since it last did. Best effort:
        a store that fails is logged (at most once a minute), and those keys are told
        again when decided again; it never stops a reading. Every
        :data:`ANNOUNCE_AGAIN` seconds, the keys are told again as they are decided (the
        store prunes keys not told for :data:`~ratelimit.backends.base.ANNOUNCED_FOR`)."""
        now = self._wall()
        if not now - ANNOUNCE_AGAIN < self._announced_since <= now:
            self._announced.clear()
            self._announced_since = now
        if not self.pending:
            return
        announcing = sorted(self.pending)
        self.pending.difference_update(announcing)  # whatever comes: the queue stays bounded
        try:
            await self.store.overrides_announce(self.namespace, announcing)
        except (RateLimitError, OSError, ValueError) as exc:
            quiet = not self.read or self.failing()  # an outage the decisions report
            self.warn(
                "announce",
                f"limited keys not announced (best effort): {exc}",
                logging.INFO if quiet else logging.WARNING,
            )
            return
        self._announced.update(announcing)

    async def _check(self) -> None:
        await self.announce()
        try:
            version = await self.store.overrides_version(self.namespace)
            if version != self.version:
                version, table = await self.store.overrides_load(self.namespace)
                self.load(version, table)
        except (RateLimitError, OSError) as exc:
            # the decisions report an outage of their store: said here only in passing,
            # unless the store answers them and fails this reading alone
            quiet = not self.read or self.failing()
            self.warn(
                "refresh",
                f"overrides not refreshed (the last ones read stay): {exc}",
                logging.INFO if quiet else logging.WARNING,
            )
        finally:
            self.read = True

    async def lift(self) -> None:
        """Tell every process of the namespace that counters were reset: the namespace's
        version is made anew (a write of nothing, under :data:`LIFTED`), so each process's
        next reading, within ``refresh`` seconds, reads the table again and drops its
        cached refusals (``changed``), as an override change reaches it."""
        await self.store.overrides_write(self.namespace, LIFTED, None, None)
        self.version = None

    async def aclose(self) -> None:
        """Stop the task (when the limiter closes)."""
        task, self._task, self._loop = self._task, None, None
        if task is not None and not task.done():
            if task.get_loop() is _running_loop():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            elif not task.get_loop().is_closed():  # another thread's loop: cancelled there
                task.get_loop().call_soon_threadsafe(task.cancel)

    def put(self, identity: str, override: Override | None, key: str, values: Values) -> None:
        """This process wrote ``override`` (``None``: deleted it): its copy has it at once;
        the next reading reads the whole table again."""
        table: dict[Any, list[Override]] = self._pairs if values else self._whole
        at: Any = (key, *values[0]) if values else key
        had = at in table
        kept = [o for o in table.get(at, ()) if o.values != values]
        if override is not None:
            kept.append(override)
        if kept:
            table[at] = kept
            if not had:
                self.keys[key] = self.keys.get(key, 0) + 1
        elif had:
            del table[at]
            self.keys[key] -= 1
            if not self.keys[key]:
                del self.keys[key]
        self.version = None

    def load(self, version: int, table: Mapping[str, str]) -> None:
        """Replace the copy with the store's ``table`` at ``version``; at a new version,
        the limiter's cached refusals go too (``changed``: a reset may be why)."""
        if version != self.version:
            self._changed()
        whole: dict[str, list[Override]] = {}
        pairs: dict[tuple[str, str, str], list[Override]] = {}
        known = set()
        for identity, record in table.items():
            if identity.startswith(ANNOUNCED):
                known.add(identity[len(ANNOUNCED) :])
                continue
            override = decode(identity, record)
            if override is None:
                continue
            if override.values:
                name, value = override.values[0]
                pairs.setdefault((override.key, name, value), []).append(override)
            else:
                whole.setdefault(override.key, []).append(override)
        self._index(whole, pairs)
        self.known = frozenset(known) | self._announced
        self.version = version

    def _index(
        self,
        whole: dict[str, list[Override]],
        pairs: dict[tuple[str, str, str], list[Override]],
    ) -> None:
        self._whole, self._pairs = whole, pairs
        keys: dict[str, int] = dict.fromkeys(whole, 1)
        for key, _, _ in pairs:
            keys[key] = keys.get(key, 0) + 1
        self.keys = keys

    def has(self, key: str) -> bool:
        """Whether ``key`` has overrides now: a decision's first question. A call is
        decided under ``key`` here, which the store is told at the next check."""
        self.used = True
        if (
            key not in self._announced
            and key not in self.pending
            and len(self._announced) + len(self.pending) < MAX_ANNOUNCED
            and announceable(key)
        ):
            self.pending.add(key)
        return key in self.keys

    def quiet(self, key: str) -> bool:
        """Neither :meth:`stale` nor :meth:`has` ``key`` (whose bookkeeping it does): a
        call of ``key`` is decided by its limit's own rules, with nothing to await first.
        The direct path's one question (:mod:`ratelimit.front.direct`)."""
        if not self.read or not self.refresh:
            return False
        loop = self._loop  # the refresh task's, running (in this thread or another)
        if loop is None or not loop.is_running():
            return False
        if key in self._announced or key in self.pending:  # has(), told already
            self.used = True
            return key not in self.keys
        return not self.has(key)

    def match(self, key: str, named: Mapping[str, str | None]) -> Override | None:
        """The override in force for a call of ``key`` with selector values ``named``
        (``None`` values name nothing), or ``None``."""
        if key not in self.keys:
            return None
        found = self._whole.get(key)
        pairs = self._pairs
        for name, value in named.items():
            if value:
                hit = pairs.get((key, name, value))
                if hit is not None:
                    found = hit if found is None else [*found, *hit]
        if found is None:  # the common case of a key with overrides: none for this call
            return None
        now = self._wall()
        return winner(
            o
            for o in found
            if o.live(now) and all(named.get(name) == value for name, value in o.values)
        )

    def warn(self, what: object, message: str, level: int = logging.WARNING) -> None:
        """Log ``message`` (a warning), at most once a minute per ``what``."""
        now = time.monotonic()
        if now - self._warned.get(what, -math.inf) >= WARN_EVERY:
            self._warned[what] = now
            logger.log(level, "ratelimit: %s", message)
