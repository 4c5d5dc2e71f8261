"""The Postgres strategy (``postgresql://``): window counters in a table, one round trip
per decision.

:class:`PostgresBackend` holds the pool and runs each statement on it (``_guarded``); each
feature is a module of its own, calling a function of ``schema.sql``: :mod:`.decisions`
(``ratelimit_decide``), :mod:`.settles`, :mod:`.resets`, :mod:`.overrides`,
:mod:`.penalties`; concurrency slots it refuses (``holds_slots``). Here too: the counter API
(``ratelimit_update``) and ``sync_rate``'s syncs (``ratelimit_sync``).

Setting up (the pool opened, the table and functions in place) is not a decision: it runs
apart, bounded by ``setup_timeout`` (:mod:`.pool`); a table or function found gone is put
back, once, and the call decided. :meth:`PostgresBackend.setup` does it ahead, for
deployments that forbid DDL at run time.

``asyncpg`` comes with the ``postgres`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ratelimit.backends.base import Clock, Push, Totals
from ratelimit.backends.loops import LoopBinding
from ratelimit.backends.naming import identifier_key
from ratelimit.backends.postgres.decisions import Decisions
from ratelimit.backends.postgres.overrides import PostgresOverrides
from ratelimit.backends.postgres.penalties import PostgresPenalties
from ratelimit.backends.postgres.pool import SetUpPool
from ratelimit.backends.postgres.resets import Resets
from ratelimit.backends.postgres.settles import Settles
from ratelimit.backends.postgres.url import SCHEMES
from ratelimit.core.checks import check_clock, check_seconds, check_timeout
from ratelimit.core.plan import CounterUpdate
from ratelimit.errors import BackendError, ConfigurationError, LimiterClosedError

if TYPE_CHECKING:
    import asyncpg

T = TypeVar("T")
logger = logging.getLogger("ratelimit")

SETUP_TIMEOUT = 5.0
"""Default deadline of setting the store up (the pool opened, the schema in place)."""
SYNC_TIMEOUT = 5.0
"""Deadline of one sync (``sync_rate``), as on Redis: it is off the request path."""


def _asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError:
        raise ConfigurationError(
            "postgresql:// needs asyncpg: pip install 'ratelimit-rules[postgres]'"
        ) from None
    return asyncpg


class PostgresBackend(Decisions, Settles, Resets, PostgresOverrides, PostgresPenalties):
    """Window counters in PostgreSQL. ``dsn`` is a ``postgresql://`` URL (its pool is opened
    in the running event loop at first use, of up to ``max_size`` connections); ``clock``
    (seconds) replaces the database's clock, for tests; ``timeout`` bounds each decision,
    once the store is set up; ``setup_timeout`` bounds setting it up (see the module's
    docstring).

    Example::

        rl = RateLimit.from_url("postgresql://app@db/app", algorithm="sliding-window")
    """

    def __init__(
        self,
        dsn: str,
        *,
        clock: Clock | None = None,
        timeout: float | None = None,
        max_size: int = 20,
        setup_timeout: float = SETUP_TIMEOUT,
    ) -> None:
        self._asyncpg = _asyncpg()
        # the checks Settings makes of the same settings (setup_timeout is this store's own)
        check_seconds("setup_timeout", setup_timeout)
        check_clock(clock)
        check_timeout(timeout)
        self.dsn = dsn
        self.clock = clock
        self.timeout = timeout
        self.max_size = max_size
        self.setup_timeout = setup_timeout
        self._missing = (self._asyncpg.UndefinedTableError, self._asyncpg.UndefinedFunctionError)
        self._pool = SetUpPool(self._asyncpg, dsn, max_size, setup_timeout)
        self._failing = False  # the last call on a connection failed (not a SQL error)
        self._loop = LoopBinding()
        self._closed = False
        self._decisions = 0
        self._cleaning: asyncio.Task[None] | None = None

    async def setup(self) -> str:
        """Open the pool and put the table and functions in place (nothing when this
        version's are there already), within ``setup_timeout``; returns what was done.
        Calls do it themselves at first use; calling it ahead fails early, and lets a
        deployment run it with a role that may run DDL. ``BackendError`` when it fails."""
        self._ready_pool()  # closed, or another loop
        await self._pool.set_up(self.setup_timeout)
        return self._pool.done

    def _ready_pool(self) -> asyncpg.Pool | None:
        """The pool, if the store is set up in the running loop."""
        if self._closed:
            raise LimiterClosedError("this Postgres backend")
        if self._loop.moved():  # a pool serves the loop that opened it
            self._pool.forget()
        pool: asyncpg.Pool | None = self._pool.ready()
        return pool

    async def _guarded(
        self,
        work: Callable[[asyncpg.Connection], Awaitable[T]],
        what: str,
        sync: bool = False,
    ) -> T:
        """Run ``work`` on a connection within the backend's ``timeout`` (a sync's:
        :data:`SYNC_TIMEOUT`) once the store is set up; the database's failures as
        ``BackendError``. A table or function found missing sets the store up again, once,
        and ``work`` runs again."""
        deadline = SYNC_TIMEOUT if sync else self.timeout
        try:
            pool = self._ready_pool() or await self._set_up_for(what, deadline)
            generation = self._pool.generation
            try:
                return await self._on_connection(pool, work, deadline)
            except self._missing as exc:
                logger.warning("ratelimit: setting Postgres up again: %s", exc)
                self._pool.lost(generation)
                pool = self._ready_pool() or await self._set_up_for(what, None)
                return await self._on_connection(pool, work, deadline)
        except (LimiterClosedError, ConfigurationError, BackendError):
            raise
        except TimeoutError:
            raise BackendError(f"postgres did not answer within {deadline} s to {what}") from None
        except (OSError, self._asyncpg.PostgresError, self._asyncpg.InterfaceError) as exc:
            raise BackendError(f"postgres failed to {what}: {exc}") from exc

    async def _set_up_for(self, what: str, deadline: float | None) -> asyncpg.Pool:
        """Set up for a call (``what``): the first set-up is waited for in full; after a
        failed one, the next is waited for within the call's ``deadline`` only."""
        try:
            pool: asyncpg.Pool = await self._pool.set_up(deadline if self._pool.failed else None)
            return pool
        except BackendError as exc:
            raise BackendError(f"postgres failed to {what}: {exc}") from exc.__cause__

    async def _on_connection(
        self,
        pool: asyncpg.Pool,
        work: Callable[[asyncpg.Connection], Awaitable[T]],
        deadline: float | None,
    ) -> T:
        """Take a connection from ``pool`` and run ``work`` on it within ``deadline``.

        Taking it is not part of the deadline: waiting for a busy pool is back-pressure,
        and opening a connection (the pool grows on demand) is setting up, bounded by
        ``setup_timeout`` while the database answers; once a call has failed, by the
        call's own deadline until one succeeds again. A connection whose work failed or
        was cut short is closed, not reused (the pool opens another when needed)."""
        wait = self.setup_timeout if not self._failing else deadline or self.setup_timeout
        try:
            connection = await pool.acquire(timeout=wait)
        except BaseException as exc:
            self._failing = not isinstance(exc, self._asyncpg.PostgresError)
            if isinstance(exc, TimeoutError):
                raise BackendError(f"postgres gave no connection within {wait} s") from None
            raise
        try:
            async with asyncio.timeout(deadline) as budget:
                result = await work(connection)
        except BaseException as exc:
            connection.terminate()  # cut short or failed: its state is unknown
            await pool.release(connection)  # at once: it is closed
            self._failing = not isinstance(exc, self._asyncpg.PostgresError)
            raise
        self._failing = False
        with contextlib.suppress(TimeoutError):  # the decision stands; a slow release goes
            async with asyncio.timeout_at(budget.when()):  # on alone (within ``wait``)
                await pool.release(connection)
        return result

    holds_slots = False
    """It holds no concurrency slots (``rl.concurrency`` needs memory:// or Redis)."""
    schemes = SCHEMES
    """The storage URLs that open it (:data:`.url.SCHEMES`, declared apart so that a URL
    is checked without loading this module)."""

    async def update_counter(self, update: CounterUpdate) -> float:
        rate: float = await self._guarded(
            lambda db: db.fetchval(
                "SELECT ratelimit_update($1, $2, $3, $4, $5)",
                identifier_key(update.identifier),
                update.size_us,
                update.value,
                update.weight,
                self._now(),
            ),
            f"update counter {update.identifier.key!r}",
        )
        return rate

    async def sync_counters(
        self, pushes: Sequence[Push]
    ) -> tuple[int | None, list[Totals | Exception]]:
        """For ``sync_rate > 0``: push local diffs and fetch totals for many identifiers in
        one round trip (``ratelimit_sync``), as the Redis script engine's method of this
        name does. One statement: when it fails, ``BackendError`` is raised and no diff
        was applied."""
        keys: list[str] = []
        sizes: list[int] = []
        indexes: list[int] = []
        diffs: list[float] = []
        first: list[int] = []  # per push, its first entry (1-based)
        for identifier, entries, _ in pushes:  # one layout: whether it spreads is moot
            first.append(len(keys) + 1)
            for size, index, diff in entries:
                keys.append(identifier_key(identifier))
                sizes.append(size)
                indexes.append(index)
                diffs.append(diff)
        if not keys:
            return None, [{} for _ in pushes]
        reply: list[float] = await self._guarded(
            lambda db: db.fetchval(
                "SELECT ratelimit_sync($1, $2, $3, $4, $5)",
                keys,
                sizes,
                indexes,
                diffs,
                self._now(),
            ),
            "sync counters",
            sync=True,  # every live key's diffs at once, off the request path
        )
        by_entry: dict[int, tuple[int, dict[int, float]]] = {}
        for n in range(1, len(reply), 6):
            windows = {
                int(index): count
                for index, count in ((reply[n + 2], reply[n + 3]), (reply[n + 4], reply[n + 5]))
                if index >= 0
            }
            by_entry[int(reply[n])] = (int(reply[n + 1]), windows)
        totals: list[Totals | Exception] = []
        for push, start in enumerate(first):
            count = len(pushes[push][1])
            found: Totals = {}
            for entry in range(start, start + count):
                if entry in by_entry:
                    size, windows = by_entry[entry]
                    found.setdefault(size, {}).update(windows)
            totals.append(found)
        return int(reply[0]), totals

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._cleaning is not None:
            await asyncio.gather(self._cleaning, return_exceptions=True)
        loop = self._loop.loop
        if loop is asyncio.get_running_loop():
            await self._pool.aclose()
        elif loop is None or not loop.is_running():  # opened by a loop that has ended
            self._pool.forget()
