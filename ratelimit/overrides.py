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
override's identity (:func:`override_id`) to its record (:func:`encode`); the keys its
limits use are announced in the same table (``key:<key>``, no version bump), so that the
command line can warn of an override for a key nothing limits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ratelimit.backends.base import OverrideStore
from ratelimit.errors import RateLimitError
from ratelimit.plan import CompiledTree, compile_tree
from ratelimit.rules import to_tree

logger = logging.getLogger("ratelimit")

REFRESH = 1.0
"""Default seconds between two checks of the store for changed overrides."""
ANNOUNCED = "key:"
"""The prefix of a key's announcement in the store's table (override ids start ``[``)."""
MAX_ANNOUNCED = 10_000
"""At most this many keys are announced per process (keys made from requests are many)."""
WARN_EVERY = 60.0
"""Seconds between two warnings of the same unusable override or failing refresh."""

Values = tuple[tuple[str, str], ...]
"""An override's selector values: (name, value) pairs sorted by name."""


@dataclass(frozen=True, slots=True)
class Override:
    """Rules that replace those of ``key`` for calls with every one of ``values``.

    - ``key``: the limit's key;
    - ``values``: (selector, value) pairs, sorted by selector; empty for every call;
    - ``rules``: the rules in force instead, as text;
    - ``expires``: when it stops applying (seconds since the epoch), ``None`` for never;
    - ``at``: when it was set (seconds since the epoch).
    """

    key: str
    values: Values
    rules: str
    expires: float | None = None
    at: float = 0.0

    @property
    def compiled(self) -> CompiledTree:
        """The rules, compiled (parsed once per distinct text)."""
        return compile_tree(to_tree(self.rules))

    @property
    def selectors(self) -> dict[str, str]:
        """``values`` as a mapping."""
        return dict(self.values)

    def live(self, now: float) -> bool:
        """Whether it applies at ``now`` (seconds since the epoch)."""
        return self.expires is None or now < self.expires

    def __str__(self) -> str:
        who = " ".join(f"{name}={value}" for name, value in self.values) or "every call"
        return f"{self.key} [{who}]: {self.rules}"


def values_of(values: Mapping[str, object]) -> Values:
    """Selector values as an override keeps them (text, sorted by name); ``TypeError`` or
    ``ValueError`` naming a bad one."""
    pairs = []
    for name, value in values.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a selector name is a name such as apikey, not {name!r}")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise TypeError(f"the value of {name} must be text or a whole number, not {value!r}")
        if value == "":
            raise ValueError(f"the value of {name} must not be empty")
        pairs.append((name, str(value)))
    return tuple(sorted(pairs))


def override_id(key: str, values: Values) -> str:
    """The store's name of the override of ``key`` for ``values``: one per pair."""
    return json.dumps([key, [list(pair) for pair in values]], ensure_ascii=False)


def encode(override: Override) -> str:
    """What the store keeps of an override besides its id."""
    record = {"rules": override.rules, "expires": override.expires, "at": override.at}
    return json.dumps(record, ensure_ascii=False)


def decode(identity: str, record: str) -> Override | None:
    """The override a store's entry holds; ``None`` (and a warning) when it cannot be read,
    so that one bad entry never stops the others."""
    try:
        key, pairs = json.loads(identity)
        fields = json.loads(record)
        values = tuple((str(name), str(value)) for name, value in pairs)
        override = Override(
            str(key), values, str(fields["rules"]), fields.get("expires"), fields.get("at", 0.0)
        )
        override.compiled  # noqa: B018 - a text that does not parse is reported here
    except (ValueError, TypeError, KeyError, RateLimitError) as exc:
        logger.warning("ratelimit: an override in the store cannot be read (%s): %s", identity, exc)
        return None
    return override


def check_ttl(ttl: object) -> float | None:
    """``ttl=``: ``None`` or seconds above 0."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
        raise TypeError(f"ttl must be a number of seconds, or None, not {ttl!r}")
    if ttl <= 0:
        raise ValueError(f"ttl must be above 0 seconds, not {ttl!r}")
    return float(ttl)


_running_loop = asyncio._get_running_loop
"""The running event loop or ``None``, without raising: on every decision's path."""


def winner(found: Iterable[Override]) -> Override | None:
    """Of the overrides matching one call, the one in force: most values, then set last."""
    return max(found, key=lambda o: (len(o.values), o.at, o.values), default=None)


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
    ) -> None:
        self.store = store
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
        """Tell the store the keys this process decided since it last did; raises as the
        store fails."""
        if self.pending:
            announcing = sorted(self.pending)
            await self.store.overrides_announce(self.namespace, announcing)
            self._announced.update(announcing)
            self.pending.difference_update(announcing)

    async def _check(self) -> None:
        try:
            await self.announce()
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
        """Replace the copy with the store's ``table`` at ``version``."""
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
        if key not in self._announced and len(self._announced) < MAX_ANNOUNCED:
            self.pending.add(key)
        return key in self.keys

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
