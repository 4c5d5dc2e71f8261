"""Decisions on Postgres: one call of ``ratelimit_decide`` (``schema.sql``) locks the call's
identifiers (transaction-scoped advisory locks, taken in key order), reads every leaf's
current and previous window, evaluates the rule tree and, when admitted, records the call,
all on the database's clock, in one statement; its verdict stands
(:func:`~ratelimit.core.evaluation.stored_verdict`). Postgres keeps window counters only
(:data:`WEIGHS_PREVIOUS`). Expired rows are deleted every :data:`CLEANUP_EVERY` decisions,
off the request path."""

from __future__ import annotations

import asyncio
import logging

from ratelimit.algorithms import FIXED_WINDOW, SLIDING_WINDOW, US_PER_MS
from ratelimit.backends.naming import identifier_key
from ratelimit.backends.postgres.schema import DECIDE
from ratelimit.backends.postgres.statements import Statements
from ratelimit.core.decision import Decision
from ratelimit.core.evaluation import evaluate, stored_verdict
from ratelimit.core.plan import Plan
from ratelimit.errors import BackendError, ConfigurationError, LimiterClosedError

logger = logging.getLogger("ratelimit")

CLEANUP_EVERY = 1000
CLEANUP_ROWS = 10_000
WEIGHS_PREVIOUS = {SLIDING_WINDOW: True, FIXED_WINDOW: False}
"""The algorithms Postgres decides, by name: whether ``ratelimit_decide`` weighs the previous
window in (its ``p_sliding``)."""
NEEDS_WINDOWS = (
    "Postgres keeps window counters: use algorithm='sliding-window' or 'fixed-window' "
    "(a sliding log would rewrite a row of every hit's time on each call; GCRA is not "
    "offered here)"
)


def check_algorithm(algorithm: str) -> None:
    """``algorithm`` (a name) is one Postgres decides, or ``ConfigurationError``."""
    if algorithm not in WEIGHS_PREVIOUS:
        raise ConfigurationError(f"{NEEDS_WINDOWS}, not {algorithm!r}")


class Decisions(Statements):
    """A mixin: the Postgres store's ``decide``, and the cleanup of expired rows it starts."""

    _decisions: int
    _cleaning: asyncio.Task[None] | None

    algorithms = frozenset(WEIGHS_PREVIOUS)
    """The algorithms this backend decides: the window counters."""

    async def decide(self, plan: Plan) -> Decision:
        sliding = WEIGHS_PREVIOUS.get(plan.algorithm.name)
        if sliding is None:
            check_algorithm(plan.algorithm.name)
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
            [float(plan.identifier_cost(k)) for k in range(len(plan.identifiers))],
            plan.record,
            sliding,
            self._now(),
        )
        reply: list[float] = await self._guarded(
            lambda db: db.fetchval(DECIDE, *args),
            f"decide key {plan.key!r}",
        )
        allowed, now, *flat = reply
        counts = list(zip(flat[0::2], flat[1::2], strict=True))
        decision = stored_verdict(plan, bool(allowed), int(now), counts)  # what it recorded
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
                    lambda db: db.execute(
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

    async def cleanup(self) -> None:
        """Delete a batch of expired rows now (decisions do it every
        ``CLEANUP_EVERY`` calls, off the request path); waits for one under way."""
        self._cleanup()
        if self._cleaning is not None:
            await self._cleaning
