"""``rl.overrides``: set, read and delete the rules a key runs under for some callers, at
run time, in the limiter's store (see :mod:`ratelimit.overrides.cache` for how they apply).

Example::

    await rl.overrides.set("search", "apikey:1000/h", apikey="abc", ttl=86_400)
    await rl.overrides.get("search", apikey="abc")     # the Override, or None
    await rl.overrides.list("search")                   # every live one of the key
    await rl.overrides.delete("search", apikey="abc")   # True: there was one
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

from ratelimit.algorithms import Algorithm
from ratelimit.backends.base import OverrideStore
from ratelimit.core.checks import check_cost
from ratelimit.core.plan import CompiledTree, compile_tree
from ratelimit.errors import ConfigurationError
from ratelimit.overrides.cache import (
    Override,
    OverrideCache,
    check_ttl,
    decode,
    encode,
    override_id,
    values_of,
)
from ratelimit.rules.tree import RuleLike, to_tree

logger = logging.getLogger("ratelimit")

PRUNE_EVERY = 60.0
"""Seconds between two prunes of expired overrides by one process's writes."""


class Overrides:
    """The overrides of one limiter's namespace (``rl.overrides``). Every method reads or
    writes the store itself and raises as it fails (``BackendError``); the decisions read
    a copy (:class:`~ratelimit.overrides.cache.OverrideCache`) that never raises."""

    def __init__(self, cache: OverrideCache | None, algorithm: Algorithm, what: str) -> None:
        self._cache = cache
        self._algorithm = algorithm
        self._what = what  # the store's class, for the error without one
        self._pruned = -math.inf

    def _store(self) -> tuple[OverrideCache, OverrideStore]:
        if self._cache is None:
            raise ConfigurationError(
                f"this storage ({self._what}) keeps no overrides: it has no overrides_* "
                "methods (memory://, Redis and Postgres have them)"
            )
        return self._cache, self._cache.store

    async def set(
        self, key: str, rules: RuleLike, /, *, ttl: float | None = None, **values: str | int
    ) -> Override:
        """Replace the rules of ``key`` by ``rules`` for the calls with every one of
        ``values`` (none: every call of the key), for ``ttl`` seconds (``None``: until
        deleted); another override of the same key and values is replaced. Checked
        before anything is written: bad rules raise ``RuleSyntaxError``, rules this
        limiter's algorithm cannot run (a ``burst`` but under ``"gcra"``)
        ``ConfigurationError``. Counters carry on: a rule keeping its selector and span
        counts on the same counter as before."""
        pairs = self._checked(key, values)
        tree = to_tree(rules)
        check_cost(compile_tree(tree), 1, self._algorithm)
        seconds = check_ttl(ttl)
        cache, store = self._store()
        now = cache.now()
        expires = None if seconds is None else now + seconds
        override = Override(key, pairs, str(tree), expires, now, version=None)  # the store's
        identity = override_id(key, pairs)
        await store.overrides_write(cache.namespace, identity, encode(override), override.expires)
        cache.put(identity, override, key, pairs)
        if time.monotonic() - self._pruned >= PRUNE_EVERY:
            self._pruned = time.monotonic()
            await store.overrides_prune(cache.namespace, now)
        return override

    async def get(self, key: str, /, **values: str | int) -> Override | None:
        """The live override of ``key`` for exactly ``values``, or ``None``."""
        pairs = self._checked(key, values)
        table = await self._load()
        record = table.get(override_id(key, pairs))
        override = None if record is None else decode(override_id(key, pairs), record)
        return override if override is not None and override.live(self._now()) else None

    async def delete(self, key: str, /, **values: str | int) -> bool:
        """Delete the override of ``key`` for exactly ``values``; whether there was one."""
        pairs = self._checked(key, values)
        cache, store = self._store()
        identity = override_id(key, pairs)
        existed = await store.overrides_write(cache.namespace, identity, None, None)
        cache.put(identity, None, key, pairs)
        return existed

    async def list(self, key: str | None = None) -> list[Override]:
        """Every live override (of ``key``, when given), by key and values."""
        table = await self._load()
        now = self._now()
        found = []
        for identity, record in table.items():
            if identity.startswith("["):
                override = decode(identity, record)
                if override is not None and override.live(now) and key in (None, override.key):
                    found.append(override)
        return sorted(found, key=lambda o: (o.key, o.values))

    async def in_force(self, key: str, /, **values: str | int | None) -> Override | None:
        """The override a call of ``key`` with these selector values gets now, read from
        the store, or ``None`` (the limit's own rules)."""
        if not isinstance(key, str):
            raise TypeError(f"key must be text, not {type(key).__name__}")
        await self._load()
        cache, _ = self._store()
        named = {name: None if value is None else str(value) for name, value in values.items()}
        return cache.match(key, named)

    async def known(self, key: str) -> bool:
        """Whether a process said it limits ``key`` (one that decided a call of it since
        it started), as far as the store knows."""
        await self._load()
        return key in self._store()[0].known

    async def limited_keys(self) -> tuple[str, ...]:
        """The keys processes said they limit (as :meth:`known`), sorted: what ``ratelimit
        override set`` suggests when given a key none limits."""
        await self._load()
        return tuple(sorted(self._store()[0].known))

    async def refresh(self) -> None:
        """Read the overrides from the store now, into this process's copy (its task does
        every ``override_refresh`` seconds), and tell it the keys this process decided
        since it last did (best effort: logged when it fails); raises as reading fails."""
        await self._store()[0].announce()
        await self._load()

    async def find(self, key: str, values: Mapping[str, str | None]) -> Override | None:
        """For front ends of your own: the override in force for a call of ``key`` with
        selector ``values``, from this process's copy (kept up to date every
        ``override_refresh`` seconds). Never raises: a store that fails leaves the copy
        as it was. Decide the call under :meth:`rules_of` ``(override, key, compiled)``
        (``compiled``: the limit's own rules) with ``rl.decide(..., override=True)``."""
        cache = self._cache
        if cache is None:
            return None
        if cache.stale():
            await cache.current()
        return cache.match(key, values) if cache.has(key) else None

    def quiet(self, key: str) -> bool:
        """For front ends of your own: whether a call of ``key`` is decided by its own rules
        now, with nothing to await first (no override for ``key`` in this process's copy,
        which is up to date); when not, :meth:`find` answers."""
        cache = self._cache
        return cache is None or cache.quiet(key)

    def rules_of(self, override: Override, key: str, limit: CompiledTree) -> CompiledTree:
        """For front ends of your own: the rules to decide a call of ``key`` under
        ``override`` (``limit``: the limit's own rules). Every identifier is kept where
        any tree keeps it (a property of the identifier), so they are the override's own."""
        return override.compiled

    async def _load(self) -> dict[str, str]:
        """The store's table, read now (the copy is brought up to date with it)."""
        cache, store = self._store()
        version, table = await store.overrides_load(cache.namespace)
        cache.load(version, table)
        return table

    def _now(self) -> float:
        return self._store()[0].now()

    @staticmethod
    def _checked(key: object, values: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
        if not isinstance(key, str) or not key:
            raise TypeError(f"key must be non-empty text, not {key!r}")
        return values_of(values)


def _log(what: object, message: str) -> None:
    logger.warning("ratelimit: %s", message)
