"""The Postgres strategy: window counters in a PostgreSQL table (``postgresql://``)."""

from ratelimit.backends.postgres.backend import PostgresBackend, check_algorithm

__all__ = ["PostgresBackend", "check_algorithm"]
