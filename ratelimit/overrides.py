"""Overrides: the rules of one key replaced at run time for the calls whose selector values
match, kept in the limiter's own store so that every process applies them.

An :class:`Override` names a key, zero or more selector values (``apikey="abc"``) and the
rules that replace the key's own for a call whose values include all of them. None: every
call of the key. When several match one call, the one naming the most values wins, then
the one set last. A call matches on the values its limit resolved for it: those of the
selectors its rules name, and the one a rules mapping is keyed by (``tier``).

Each process reads them from a local copy (:class:`OverrideCache`) that asks the store
whether anything changed at most every ``override_refresh`` seconds (default 1): one
small read per second per process, not per decision; when something changed, the whole
set is read again. So a change reaches every process's next decision at most that late
(at once in the process that made it). A lookup is a dictionary read: a key without
overrides costs nothing more, however many other keys have some.

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

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


def winner(found: Iterable[Override]) -> Override | None:
    """Of the overrides matching one call, the one in force: most values, then set last."""
    return max(found, key=lambda o: (len(o.values), o.at, o.values), default=None)


class OverrideCache:
    """One limiter's copy of its namespace's overrides, indexed for lookups, checked
    against the store at most every ``refresh`` seconds (see the module).

    ``clock``: the limiter's injected clock (tests), which then also tells the time of
    day for expiry; else the monotonic clock paces the checks and the epoch clock
    expires."""

    __slots__ = (
        "_announced",
        "_checking",
        "_every",
        "_pairs",
        "_wall",
        "_warned",
        "_whole",
        "due",
        "keys",
        "known",
        "namespace",
        "pending",
        "refresh",
        "store",
        "version",
    )

    def __init__(
        self,
        store: OverrideStore,
        namespace: str,
        refresh: float,
        clock: Callable[[], float] | None,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.refresh = refresh
        self._every = clock or time.monotonic
        self._wall = clock or time.time
        self.due = -math.inf
        self.version: int | None = None
        self.keys: frozenset[str] = frozenset()
        """The keys with overrides now."""
        self.known: frozenset[str] = frozenset()
        """The keys the store says some process limits."""
        self._whole: dict[str, list[Override]] = {}
        self._pairs: dict[tuple[str, str, str], list[Override]] = {}
        self._announced: set[str] = set()
        self.pending: set[str] = set()
        """Keys of this process not yet announced to the store."""
        self._checking: asyncio.Future[None] | None = None
        self._warned: dict[object, float] = {}

    def now(self) -> float:
        """The time of day expiry is measured in (seconds since the epoch)."""
        return self._wall()

    def stale(self) -> bool:
        """Whether the store must be asked before the next lookup."""
        return self._every() >= self.due

    def expire(self) -> None:
        """Ask the store at the next lookup (this process changed an override)."""
        self.due = -math.inf

    async def current(self) -> None:
        """Bring the copy up to date if it is due; one check at a time, which every
        lookup meanwhile waits for. A store that fails leaves the copy as it was (logged);
        the decision that follows meets the failure on its own."""
        checking = self._checking
        if checking is None or checking.done():
            checking = self._checking = asyncio.ensure_future(self._check())
        await asyncio.shield(checking)

    async def _check(self) -> None:
        self.due = self._every() + self.refresh
        try:
            if self.pending:
                announcing = sorted(self.pending)
                await self.store.overrides_announce(self.namespace, announcing)
                self._announced.update(announcing)
                self.pending.difference_update(announcing)
            version = await self.store.overrides_version(self.namespace)
            if version != self.version:
                version, table = await self.store.overrides_load(self.namespace)
                self.load(version, table)
        except (RateLimitError, OSError) as exc:
            self.warn("refresh", f"overrides not refreshed (the last ones read stay): {exc}")

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
        self._whole, self._pairs = whole, pairs
        self.keys = frozenset(whole) | frozenset(key for key, _, _ in pairs)
        self.known = frozenset(known) | self._announced
        self.version = version

    def has(self, key: str) -> bool:
        """Whether ``key`` has overrides now: a decision's first question. A call is
        decided under ``key`` here, which the store is told at the next check."""
        if key not in self._announced and len(self._announced) < MAX_ANNOUNCED:
            self.pending.add(key)
        return key in self.keys

    def match(self, key: str, named: Mapping[str, str | None]) -> Override | None:
        """The override in force for a call of ``key`` with selector values ``named``
        (``None`` values name nothing), or ``None``."""
        if key not in self.keys:
            return None
        found = list(self._whole.get(key, ()))
        for name, value in named.items():
            if value:
                found += self._pairs.get((key, name, value), ())
        now = self._wall()
        return winner(
            o
            for o in found
            if o.live(now) and all(named.get(name) == value for name, value in o.values)
        )

    def warn(self, what: object, message: str) -> None:
        """Log ``message`` as a warning, at most once a minute per ``what``."""
        now = time.monotonic()
        if now - self._warned.get(what, -math.inf) >= WARN_EVERY:
            self._warned[what] = now
            logger.warning("ratelimit: %s", message)
