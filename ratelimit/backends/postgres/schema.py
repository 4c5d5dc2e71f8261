"""The Postgres store's schema (``schema.sql``: one table, its functions) and putting it in
place: once per database and version, under an advisory lock, and never when it is there
already, so a role that may not run DDL works against a database prepared ahead
(``ratelimit migrate``, ``await rl.setup()``).

The table carries a mark, ``COMMENT ON TABLE ratelimit_counters``, naming the version of the
schema (a digest of ``schema.sql``) that was last put in place, and its generation: a
database whose table carries this version's mark and holds every function needs nothing;
one whose mark names a later generation is left as it is (a process of an older version
starting during a rolling deploy never puts its schema back over a newer one); otherwise
the whole schema runs again (every statement of it can), then the mark is set.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from importlib import resources
from typing import Any

SCHEMA = resources.files("ratelimit.backends.postgres").joinpath("schema.sql").read_text()
SCHEMA_LOCK = 7_419_001
"""The advisory lock that serialises putting the schema in place across processes."""
TABLE = "ratelimit_counters"
VERSION = hashlib.sha256(SCHEMA.encode()).hexdigest()[:12]
GENERATION = 2
"""Raised with each change of ``schema.sql`` that an older version must not undo (2: the
overrides' version, reset marks and the settles that read them)."""
MARK = f"ratelimit schema {VERSION} generation {GENERATION}"
_GENERATION = re.compile(r"^ratelimit schema \w+ generation (\d+)$")
FUNCTIONS = tuple(dict.fromkeys(re.findall(r"CREATE OR REPLACE FUNCTION (\w+)", SCHEMA)))

_IN_PLACE = f"""
SELECT to_regclass('{TABLE}') IS NOT NULL,
       obj_description(to_regclass('{TABLE}'), 'pg_class'),
       coalesce(obj_description(to_regclass('{TABLE}'), 'pg_class') = $1, false)
       AND (SELECT count(DISTINCT proname) FROM pg_proc
            WHERE proname = ANY($2::text[]) AND pg_function_is_visible(oid)) = $3
"""


async def put_in_place(connection: Any) -> str:
    """Make sure this version of the schema is in place on ``connection``'s database, in
    one transaction under :data:`SCHEMA_LOCK`; returns what was done, in words."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
        table, mark, current = await connection.fetchrow(
            _IN_PLACE, MARK, list(FUNCTIONS), len(FUNCTIONS)
        )
        what = f"table {TABLE} and its {len(FUNCTIONS)} functions (schema {VERSION})"
        if current:
            return f"{what} were in place: nothing to do"
        later = _GENERATION.match(mark or "")
        if later is not None and int(later.group(1)) > GENERATION:
            return (
                f"a later schema is in place ({mark!r}, this version's is generation "
                f"{GENERATION}): left as it is; upgrade this process"
            )
        await connection.execute(SCHEMA)
        await connection.execute(f"COMMENT ON TABLE {TABLE} IS '{MARK}'")
        return f"{'updated' if table else 'created'} {what}"


DECIDE = "SELECT ratelimit_decide($1, $2, $3, $4, $5, $6::double precision[], $7, $8, $9)"
"""One decision (``$6``, the costs per key, cast: an older schema's function of one cost
may still be there for processes of an older version, and the cast picks this one)."""
RESET = "SELECT ratelimit_reset($1, $2, $3)"
"""Forget what keys counted, and mark them reset (a refund reserved before takes nothing)."""
SETTLE = "SELECT ratelimit_settle($1, $2, $3, $4, $5)"
"""One settle (:mod:`ratelimit.core.settling`): per (key, window size) its delta."""
_WARM_UP = (["rl:warm-up"], [1], [1], [1_000_000], [0, 0], [1.0], False, True, None)


async def warm(connection: Any, database_error: type[BaseException]) -> None:
    """Ready a connection for decisions before it serves one: the decision's statement
    prepared, its function compiled and its reads planned, by a decision that records
    nothing (done inside a decision's deadline, this made a new connection's first
    decisions miss it). Best effort: a database error leaves it cold."""
    with contextlib.suppress(database_error):
        await connection.fetchval(DECIDE, *_WARM_UP)
