"""The Postgres strategy (``postgresql://``): window counters in a table, one round trip
per decision.

A decision is one call of ``ratelimit_decide`` (``schema.sql``): it locks the call's
identifiers (transaction-scoped advisory locks, taken in key order), reads every leaf's
current and previous window, evaluates the rule tree and, when admitted, records the call,
all on the database's clock, in one statement. The table and functions are created on first
use. Expired rows are deleted every :data:`CLEANUP_EVERY` decisions, off the request path.
The sliding log and GCRA are refused: a log per identifier would be a row rewritten on every
hit, or a row per hit, neither bounded nor cheap.

``asyncpg`` comes with the ``postgres`` extra.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar

from ratelimit.algorithms import SLIDING_WINDOW, US_PER_MS
from ratelimit.backends.base import Clock, clock_us
from ratelimit.backends.naming import identifier_key
from ratelimit.decision import Decision
from ratelimit.errors import BackendError, ConfigurationError, LimiterClosedError
from ratelimit.loops import LoopBinding
from ratelimit.plan import CounterUpdate, Identifier, Plan, evaluate

Push = tuple[Identifier, Sequence[tuple[int, int, float]]]
"""One identifier's local diffs for ``sync_counters``: (window size us, window index, diff)."""
Totals = dict[int, dict[int, float]]
"""One identifier's totals from ``sync_counters``: per window size, per window index, count."""

if TYPE_CHECKING:
    import asyncpg

T = TypeVar("T")
logger = logging.getLogger("ratelimit")

SCHEMA = resources.files("ratelimit.backends.postgres").joinpath("schema.sql").read_text()
SCHEMA_LOCK = 7_419_001
"""The advisory lock that serialises creating the schema across processes."""
SYNC_TIMEOUT = 5.0
"""Deadline of one sync (``sync_rate``), as on Redis: it is off the request path."""
CLEANUP_EVERY = 1000
CLEANUP_ROWS = 10_000
ALGORITHMS = ("sliding-window", "fixed-window")
NEEDS_WINDOWS = (
    "Postgres keeps window counters: use algorithm='sliding-window' or 'fixed-window' "
    "(a sliding log would rewrite a row of every hit's time on each call; GCRA is not "
    "offered here)"
)


def check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ConfigurationError(f"{NEEDS_WINDOWS}, not {algorithm!r}")


def _asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError:
        raise ConfigurationError(
            "postgresql:// needs asyncpg: pip install 'ratelimit-rules[postgres]'"
        ) from None
    return asyncpg


class PostgresBackend:
    """Window counters in PostgreSQL. ``dsn`` is a ``postgresql://`` URL (its pool is opened
    in the running event loop at first use, of up to ``max_size`` connections); ``clock``
    (seconds) replaces the database's clock, for tests; ``timeout`` bounds each decision.

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
    ) -> None:
        self._asyncpg = _asyncpg()
        self.dsn = dsn
        self.clock = clock
        self.timeout = timeout
        self.max_size = max_size
        self._pool: asyncpg.Pool | None = None
        self._opening: asyncio.Task[asyncpg.Pool] | None = None
        self._loop = LoopBinding()
        self._closed = False
        self._decisions = 0
        self._cleaning: asyncio.Task[None] | None = None

    async def _connected(self) -> asyncpg.Pool:
        if self._closed:
            raise LimiterClosedError("this Postgres backend")
        if self._loop.moved():  # a pool serves the loop that opened it
            self._pool, self._opening = None, None
        if self._pool is None:
            if self._opening is None:
                self._opening = asyncio.get_running_loop().create_task(self._open())
            opening = self._opening
            try:
                self._pool = await asyncio.shield(opening)
            except BaseException:
                if opening.done() and self._opening is opening:
                    self._opening = None  # it failed: the next call tries again
                raise
        return self._pool

    async def _open(self) -> asyncpg.Pool:
        pool = await self._asyncpg.create_pool(self.dsn, min_size=1, max_size=self.max_size)
        async with pool.acquire() as connection, connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
            await connection.execute(SCHEMA)
        return pool

    async def create_schema(self) -> None:
        """Create the table and functions now (they are otherwise made at first use)."""
        await self._guarded(lambda pool: asyncio.sleep(0), "create the schema")

    async def _guarded(
        self,
        work: Callable[[asyncpg.Pool], Awaitable[T]],
        what: str,
        sync: bool = False,
    ) -> T:
        """Run ``work`` within the backend's ``timeout`` (a sync's: :data:`SYNC_TIMEOUT`);
        the database's failures as ``BackendError``."""
        deadline = SYNC_TIMEOUT if sync else self.timeout
        try:
            async with asyncio.timeout(deadline):
                return await work(await self._connected())
        except (LimiterClosedError, ConfigurationError):
            raise
        except TimeoutError:
            raise BackendError(f"postgres did not answer within {deadline} s to {what}") from None
        except (OSError, self._asyncpg.PostgresError, self._asyncpg.InterfaceError) as exc:
            raise BackendError(f"postgres failed to {what}: {exc}") from exc

    def _now(self) -> int | None:
        return None if self.clock is None else clock_us(self.clock)

    async def decide(self, plan: Plan) -> Decision:
        check_algorithm(plan.algorithm)
        if not plan.identifiers:
            return evaluate(plan, 0, [(0.0, 0.0)] * len(plan.compiled.rules))
        keys = [identifier_key(identifier) for identifier in plan.identifiers]
        rules = plan.compiled.rules
        args = (
            keys,
            [i + 1 for i in plan.leaf_identifiers],
            [rule.count for rule in rules],
            [rule.span_ms * US_PER_MS for rule in rules],
            list(plan.compiled.program),
            float(plan.cost),
            plan.record,
            plan.algorithm == SLIDING_WINDOW,
            self._now(),
        )
        reply: list[float] = await self._guarded(
            lambda pool: pool.fetchval(
                "SELECT ratelimit_decide($1, $2, $3, $4, $5, $6, $7, $8, $9)", *args
            ),
            f"decide key {plan.key!r}",
        )
        allowed, now, *flat = reply
        counts = list(zip(flat[0::2], flat[1::2], strict=True))
        decision = evaluate(plan, int(now), counts)
        if decision.allowed != bool(allowed):  # pragma: no cover - would be a bug in one of two
            raise BackendError(f"postgres and the evaluator disagree on key {plan.key!r}")
        self._decisions += 1
        if self._decisions % CLEANUP_EVERY == 0:
            self._cleanup()
        return decision

    def _cleanup(self) -> None:
        """Delete expired rows, a batch at a time, off the request path."""
        if self._cleaning is not None and not self._cleaning.done():
            return

        async def cleanup() -> None:
            try:
                await self._guarded(
                    lambda pool: pool.execute(
                        "DELETE FROM ratelimit_counters WHERE ctid = ANY(ARRAY(SELECT ctid "
                        "FROM ratelimit_counters WHERE expires_us < ratelimit_now($1) "
                        "LIMIT $2))",
                        self._now(),
                        CLEANUP_ROWS,
                    ),
                    "delete expired counters",
                )
            except (BackendError, LimiterClosedError) as exc:
                logger.warning("ratelimit: expired Postgres counters not deleted: %s", exc)

        self._cleaning = asyncio.get_running_loop().create_task(cleanup())

    async def reset(self, plan: Plan) -> None:
        keys = [identifier_key(identifier) for identifier in plan.identifiers]
        if keys:
            await self._guarded(
                lambda pool: pool.execute(
                    "DELETE FROM ratelimit_counters WHERE key = ANY($1)", keys
                ),
                f"reset key {plan.key!r}",
            )

    async def update_counter(self, update: CounterUpdate) -> float:
        rate: float = await self._guarded(
            lambda pool: pool.fetchval(
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
        for identifier, entries in pushes:
            first.append(len(keys) + 1)
            for size, index, diff in entries:
                keys.append(identifier_key(identifier))
                sizes.append(size)
                indexes.append(index)
                diffs.append(diff)
        if not keys:
            return None, [{} for _ in pushes]
        reply: list[float] = await self._guarded(
            lambda pool: pool.fetchval(
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
        pool = self._pool
        if pool is not None and self._loop.loop is asyncio.get_running_loop():
            await pool.close()
