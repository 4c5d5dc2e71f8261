"""The URLs that open the Postgres store: its schemes, and checking one before anything is
opened. Imports neither asyncpg nor the store, so any storage URL can be checked without
them."""

from __future__ import annotations

from urllib.parse import urlsplit

SCHEMES = ("postgresql", "postgres")
"""The schemes that open :class:`~ratelimit.backends.postgres.PostgresBackend`: its own
declaration (``PostgresBackend.schemes``). ``postgres``, which libpq also takes, goes unnamed
in messages (:data:`NAMED`)."""
NAMED = SCHEMES[:1]
"""The schemes messages name."""


def check_postgres_url(url: str) -> None:
    """Each ``host[:port]`` of a (possibly multi-host) ``postgresql://`` URL: ``ValueError``
    saying which is wrong. Opens nothing."""
    hosts = urlsplit(url).netloc.rpartition("@")[2]
    if not hosts:
        return  # the default host, or ?host= in the query
    for host in hosts.split(","):
        port = host.rpartition("]")[2] if host.startswith("[") else host
        _, colon, digits = port.rpartition(":") if ":" in port else ("", "", "")
        if not host or (colon and not (digits.isdigit() and int(digits) <= 65535)):
            raise ValueError(f"hosts are host[:port] with a port from 0 to 65535, not {host!r}")
