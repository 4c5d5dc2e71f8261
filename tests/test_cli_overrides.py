"""``ratelimit override ...`` on the stores users have: PostgreSQL as tenants.md writes the
commands (no ``--algorithm``), and TTLs too large for a calendar (refused where set, and a
record that holds one, written by an older version, read without a traceback)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ratelimit import RateLimit
from ratelimit.cli.command import main as cli
from ratelimit.overrides.cache import Override, encode, override_id

pytestmark = pytest.mark.timeout(60)


@pytest.mark.postgres
def test_override_commands_on_postgres_as_the_docs_write_them(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    postgres_url: str,
    namespace: str,
) -> None:
    monkeypatch.delenv("RATELIMIT_ALGORITHM", raising=False)
    store = ["--storage", postgres_url, "--namespace", namespace]
    key = [*store, "--key", "search", "apikey=abc"]
    assert cli(["override", "set", *key, "apikey:1000/h", "--ttl", "86400"]) == 0
    assert "set: search [apikey=abc]: apikey:1000/h, until" in capsys.readouterr().out
    assert cli(["override", "get", *key]) == 0
    assert "apikey:1000/h" in capsys.readouterr().out
    assert cli(["override", "list", *store]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == f"1 override in namespace {namespace!r}:"
    assert listed[1].startswith("search [apikey=abc]: apikey:1000/h, until")
    assert len(listed) == 2
    assert cli(["override", "list", *store, "--key", "search"]) == 0
    assert cli(["peek", *store, "--key", "search", "apikey:100/h", "apikey=abc"]) == 0
    assert "rules in force: apikey:1000/h (override of apikey='abc'" in capsys.readouterr().out
    assert cli(["override", "delete", *key]) == 0
    assert cli(["override", "get", *key]) == 1  # none left
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    # reading needs no algorithm; setting rules for one Postgres does not decide is refused
    assert cli(["override", "list", *store, "--algorithm", "gcra"]) == 0
    assert cli(["override", "set", *key, "apikey:9/h", "--algorithm", "gcra"]) == 1
    assert "not 'gcra'" in capsys.readouterr().err


@pytest.mark.redis
def test_a_ttl_too_large_is_refused_where_set(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str
) -> None:
    store = ["--storage", redis_url, "--namespace", namespace]
    assert cli(["override", "set", *store, "--key", "search", "9/h", "--ttl", "1e18"]) == 1
    assert "ttl" in capsys.readouterr().err
    assert cli(["override", "list", *store]) == 0
    assert capsys.readouterr().out == (  # nothing was written
        f"no overrides in namespace {namespace!r} (is the namespace right? the library's "
        "default is '')\n"
    )


async def test_the_api_refuses_a_ttl_too_large() -> None:
    rl = RateLimit.from_url("memory://")
    with pytest.raises(ValueError, match="ttl"):
        await rl.overrides.set("search", "9/h", ttl=1e18)
    await rl.overrides.set("search", "9/h", ttl=10 * 365 * 86_400)  # ten years: kept
    assert await rl.overrides.list() != []
    await rl.aclose()


@pytest.mark.redis
def test_a_stored_expiry_past_the_calendar_is_read_without_a_traceback(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str
) -> None:
    async def write() -> None:
        rl = RateLimit.from_url(redis_url, namespace)
        store: Any = rl.storage
        for expires in (1e18, 1e300):  # as an older version wrote ttl=1e18, and beyond
            override = Override("search", (("apikey", str(expires)),), "9/h", expires, 0.0)
            identity = override_id("search", override.values)
            await store.overrides_write(namespace, identity, encode(override), expires)
        await rl.aclose()

    asyncio.run(write())
    store = ["--storage", redis_url, "--namespace", namespace]
    assert cli(["override", "list", *store]) == 0
    out = capsys.readouterr()
    assert out.out.count("search [apikey=") == 2
    assert "Traceback" not in out.err
    assert cli(["override", "get", *store, "--key", "search", "apikey=1e+18"]) == 0
    assert "search [apikey=1e+18]: 9/h" in capsys.readouterr().out
