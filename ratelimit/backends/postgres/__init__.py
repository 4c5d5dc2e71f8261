"""The Postgres strategy: window counters in a PostgreSQL table (``postgresql://``).

Importing this package loads only :mod:`.url` (the schemes, checking a URL), so that every
storage URL can be checked without loading the store; :class:`PostgresBackend` (:mod:`.backend`)
and :func:`check_algorithm` (:mod:`.decisions`) load when first asked for here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ratelimit.backends.postgres.url import SCHEMES, check_postgres_url

if TYPE_CHECKING:
    from ratelimit.backends.postgres.backend import PostgresBackend
    from ratelimit.backends.postgres.decisions import check_algorithm


def __getattr__(name: str) -> Any:
    if name == "PostgresBackend":
        from ratelimit.backends.postgres import backend

        return backend.PostgresBackend
    if name == "check_algorithm":
        from ratelimit.backends.postgres import decisions

        return decisions.check_algorithm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SCHEMES", "PostgresBackend", "check_algorithm", "check_postgres_url"]
