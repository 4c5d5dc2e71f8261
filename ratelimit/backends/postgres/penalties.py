"""Penalties on Postgres (:class:`~ratelimit.backends.penalty_store.PenaltyStore`): the
table ``ratelimit_penalties`` of ``schema.sql``, noted by its function
``ratelimit_note_refusal`` (one statement, the row locked: two processes that cross the
threshold together start one hold), on the database's clock unless one is injected. A
whole key's hold keeps ``''`` as its selector and value. Keys and values are kept as they
are, except those ``text`` cannot hold or too long for the row's index (:func:`stored`).
Rows whose time has passed are deleted when holds are listed or lifted, and every
:data:`SWEEP_EVERY` refusals a backend notes (10 000 at most at a time)."""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, unquote

from ratelimit.backends.penalty_store import PenaltyHold
from ratelimit.core.plan import Identifier
from ratelimit.errors import BackendError

NOW = "coalesce($1::bigint, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)"
LEFT = f"""
SELECT held_until - {NOW} FROM ratelimit_penalties
WHERE namespace = $2 AND key = $3 AND selector = $4 AND value = $5
"""
LIST = f"""
WITH now AS (SELECT {NOW} AS us),
gone AS (
    DELETE FROM ratelimit_penalties
    WHERE namespace = $2 AND expires_us <= (SELECT us FROM now)
)
SELECT key, selector, value, held_until - (SELECT us FROM now) FROM ratelimit_penalties
WHERE namespace = $2 AND ($3::text IS NULL OR key = $3) AND held_until > (SELECT us FROM now)
ORDER BY key, selector, value
"""
LIFT = f"""
WITH lifted AS (
    DELETE FROM ratelimit_penalties
    WHERE namespace = $2 AND key = $3
      AND ($4::text IS NULL OR (selector = $4 AND value = $5))
    RETURNING held_until
)
SELECT count(*) FILTER (WHERE held_until > {NOW}) FROM lifted
"""


MAX_STORED = 512
"""The most UTF-8 bytes of a key or value kept as it is (a longer one is kept as a digest:
a row's index entry must stay small)."""
_ODD = re.compile("[%\x00\ud800-\udfff]")


def stored(text: str) -> str:
    """``text`` (a key or a value) as the table keeps it: as it is, unless it holds what
    PostgreSQL's ``text`` cannot (NUL, a lone surrogate), percent-encoded then (``%``
    too, so that nothing else reads back the same); longer than :data:`MAX_STORED` bytes,
    ``%#`` and a 128-bit BLAKE2b digest (listed so: it cannot be read back)."""
    kept = _ODD.sub(lambda m: quote(m[0], safe="", errors="surrogatepass"), text)
    if len(kept.encode()) <= MAX_STORED:
        return kept
    data = text.encode("utf-8", "surrogatepass")
    return "%#" + hashlib.blake2b(data, digest_size=16).hexdigest()


def shown(text: str) -> str:
    """What :func:`stored` kept, read back (a digest stays a digest)."""
    if "%" not in text or text.startswith("%#"):
        return text
    return unquote(text, errors="surrogatepass")


SWEEP_EVERY = 1024
"""Refusals noted by one backend between two deletions of rows past their time."""
SWEEP = f"""
DELETE FROM ratelimit_penalties WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ratelimit_penalties WHERE expires_us <= {NOW} LIMIT 10000
    FOR UPDATE SKIP LOCKED
))
"""


def _named(target: Identifier) -> tuple[str, str, str, str]:
    value = "" if target.value is None else stored(target.value)
    return target.namespace, stored(target.key), target.selector or "", value


class PostgresPenalties:
    """A mixin for the Postgres backend, whose ``_guarded`` runs a statement and ``_now``
    gives the injected clock's time (us), else ``None``."""

    _guarded: Callable[..., Awaitable[Any]]
    _now: Callable[[], int | None]

    async def note_refusal(
        self, target: Identifier, count: int, span_ms: int, hold_ms: int
    ) -> float:
        ends: int = await self._guarded(
            lambda db: db.fetchval(
                "SELECT ratelimit_note_refusal($1, $2, $3, $4, $5, $6, $7, $8)",
                *_named(target),
                self._now(),
                span_ms * 1000,
                count,
                hold_ms * 1000,
            ),
            "note a refusal for a penalty",
        )
        notes = self.__dict__["_penalty_notes"] = self.__dict__.get("_penalty_notes", 0) + 1
        if notes % SWEEP_EVERY == 0:  # rows of values refused once and never again
            with contextlib.suppress(BackendError):  # the next sweep deletes them
                await self._guarded(lambda db: db.execute(SWEEP, self._now()), "sweep penalties")
        return hold_ms / 1000 if ends else 0.0

    async def penalty_left(self, target: Identifier) -> float:
        left: int | None = await self._guarded(
            lambda db: db.fetchval(LEFT, self._now(), *_named(target)), "read a penalty's hold"
        )
        return left / 1_000_000 if left is not None and left > 0 else 0.0

    async def list_penalties(self, namespace: str, key: str | None = None) -> list[PenaltyHold]:
        listed = None if key is None else stored(key)
        rows = await self._guarded(
            lambda db: db.fetch(LIST, self._now(), namespace, listed), "list penalties"
        )
        return [
            PenaltyHold(
                shown(held), selector or None, shown(value) if selector else None, left / 1e6
            )
            for held, selector, value, left in rows
        ]

    async def lift_penalties(
        self, namespace: str, key: str, selector: str | None = None, value: str | None = None
    ) -> int:
        lifted: int = await self._guarded(
            lambda db: db.fetchval(
                LIFT, self._now(), namespace, stored(key), selector, stored(value or "")
            ),
            "lift penalties",
        )
        return lifted
