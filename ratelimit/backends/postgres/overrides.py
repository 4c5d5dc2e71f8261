"""Overrides on Postgres (:class:`~ratelimit.backends.base.OverrideStore`): the tables
``ratelimit_overrides`` and ``ratelimit_override_versions`` of ``schema.sql``, written by
its functions ``ratelimit_override_write`` and ``ratelimit_override_prune``. Each override's
row keeps the namespace's version its write made (column ``version``), which reading
stamps into its record (:func:`~ratelimit.backends.base.stamped`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ratelimit.backends.base import stamped

VERSION = (
    "SELECT coalesce((SELECT version FROM ratelimit_override_versions WHERE namespace = $1), 0)"
)
LOAD = """
SELECT coalesce((SELECT version FROM ratelimit_override_versions WHERE namespace = $1), 0),
       coalesce(array_agg(id), '{}'), coalesce(array_agg(record), '{}'),
       coalesce(array_agg(version), '{}')
FROM ratelimit_overrides WHERE namespace = $1
"""
ANNOUNCE = """
INSERT INTO ratelimit_overrides (namespace, id, record, expires)
SELECT $1, 'key:' || k, extract(epoch FROM clock_timestamp())::text, NULL
FROM unnest($2::text[]) AS k
ON CONFLICT (namespace, id) DO UPDATE SET record = excluded.record
"""
"""Announced keys carry the database's time, and are pruned by ``ratelimit_override_prune``
once 7 days old (:data:`~ratelimit.backends.base.ANNOUNCED_FOR`)."""


class PostgresOverrides:
    """A mixin for the Postgres backend, whose ``_guarded`` runs a statement."""

    _guarded: Callable[..., Awaitable[Any]]

    async def overrides_version(self, namespace: str) -> int:
        version: int = await self._guarded(
            lambda db: db.fetchval(VERSION, namespace), "read the overrides' version"
        )
        return version

    async def overrides_load(self, namespace: str) -> tuple[int, dict[str, str]]:
        version, ids, records, versions = await self._guarded(
            lambda db: db.fetchrow(LOAD, namespace), "read the overrides"
        )
        return version, {
            identity: record if made is None else stamped(record, made)
            for identity, record, made in zip(ids, records, versions, strict=True)
        }

    async def overrides_write(
        self, namespace: str, identity: str, record: str | None, expires: float | None
    ) -> bool:
        existed: bool = await self._guarded(
            lambda db: db.fetchval(
                "SELECT ratelimit_override_write($1, $2, $3, $4)",
                namespace,
                identity,
                record,
                expires,
            ),
            "write an override",
        )
        return existed

    async def overrides_announce(self, namespace: str, keys: Sequence[str]) -> None:
        if keys:
            await self._guarded(
                lambda db: db.execute(ANNOUNCE, namespace, list(keys)), "announce limited keys"
            )

    async def overrides_prune(self, namespace: str, now: float) -> int:
        pruned: int = await self._guarded(
            lambda db: db.fetchval("SELECT ratelimit_override_prune($1, $2)", namespace, now),
            "prune expired overrides",
        )
        return pruned
