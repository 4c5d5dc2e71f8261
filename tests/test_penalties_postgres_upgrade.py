"""Penalties on a PostgreSQL database set up by the version before them: its schema (no
``ratelimit_penalties`` table, no ``ratelimit_note_refusal``) carries that version's mark;
the first use of a limiter of this version, or ``setup()`` (``ratelimit migrate``), puts
the table and its function in place, and holds then work."""

from __future__ import annotations

import hashlib
import subprocess

import asyncpg
import pytest

from ratelimit import RateLimit
from tests.test_postgres_setup import fresh_database
from tests.workers import ROOT

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]

BEFORE = "3dacdb3"
"""The commit before penalties (issue 39): its schema.sql, generation 2."""


def schema_before() -> str:
    return subprocess.run(
        ["git", "show", f"{BEFORE}:ratelimit/backends/postgres/schema.sql"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.parametrize("first", ["decide", "setup"])
async def test_a_database_of_the_version_before_gets_the_penalties_table(
    postgres_url: str, first: str
) -> None:
    try:
        before = schema_before()
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no git history here: {exc}")
    mark = f"ratelimit schema {hashlib.sha256(before.encode()).hexdigest()[:12]} generation 2"
    async with fresh_database(postgres_url) as url:
        connection = await asyncpg.connect(url)
        try:
            await connection.execute(before)
            await connection.execute(f"COMMENT ON TABLE ratelimit_counters IS '{mark}'")
            assert await connection.fetchval("SELECT to_regclass('ratelimit_penalties')") is None
            rl = RateLimit.from_url(url, "upgrade", algorithm="fixed-window", timeout=5)
            try:
                if first == "setup":
                    assert "updated" in await rl.setup()
                limit = rl.limit("ip:1/h", key="k", ip="x", penalty="2 refusals/m for 10m")
                decisions = [await limit.decide() for _ in range(4)]
                assert not any(d.degraded for d in decisions)
                assert [d.penalty is not None for d in decisions] == [False, False, True, True]
                assert [h.value for h in await rl.penalties.list()] == ["x"]
            finally:
                await rl.aclose()
            found = await connection.fetchval("SELECT to_regclass('ratelimit_penalties')")
            assert found is not None
        finally:
            await connection.close()
