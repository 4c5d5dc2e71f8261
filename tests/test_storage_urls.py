"""A malformed storage URL (issue 21, item 17): a ``ConfigurationError`` naming it when the
limiter is made, and exit 3 naming ``--storage`` or ``RATELIMIT_STORAGE`` from the command
line and the service, never a traceback. Each store declares its schemes (issue 22, item 5):
every scheme declared opens that store, and the messages name them; so does what else it
can do, which the core reads with a default for a backend object that does not say."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ratelimit import ConfigurationError, MemoryBackend, RateLimit
from ratelimit.algorithms import GCRA, named
from ratelimit.backends.base import check_supported, clock_of, holds_slots
from ratelimit.backends.postgres import PostgresBackend
from ratelimit.backends.postgres.url import NAMED
from ratelimit.backends.redis import RedisCommandBackend, RedisScriptBackend
from ratelimit.backends.synced import SyncedBackend
from ratelimit.backends.urls import SCHEMES, check_storage_url, redacted
from tests.workers import ROOT

MALFORMED = [
    ("redis://h:notaport/0", "notaport"),
    ("rediss://h:70000/0", "out of range"),
    ("redis://h/0?socket_timeout=soon", "socket_timeout"),
    ("redis+sentinel://s1:x,s2/mymaster", "host:port"),
    ("redis+sentinel://s1:26379", "names the service"),
    ("postgresql://h:notaport/db", "notaport"),
    ("postgresql://h1:5432,h2:x/db", "h2:x"),
    ("redis://[::1/0", "IPv6"),
]


@pytest.mark.parametrize(("url", "named"), MALFORMED)
def test_a_malformed_url_is_refused_when_the_limiter_is_made(url: str, named: str) -> None:
    algorithm = "sliding-window" if url.startswith("postgresql") else "sliding-log"
    with pytest.raises(ConfigurationError, match="storage URL") as refused:
        RateLimit.from_url(url, algorithm=algorithm)
    assert named in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "memory://",
        "redis://127.0.0.1:6379/0",
        "unix:///tmp/redis.sock",
        "redis+sentinel://s1,s2:26380/mymaster/1",
        "postgresql://app@h1:5432,h2:5433/app",
        "postgresql://app@[::1]:5432/app",
        "postgresql:///app?host=/var/run/postgresql",
    ],
)
def test_well_formed_urls_pass(url: str) -> None:
    check_storage_url(url)


def test_a_password_is_never_shown() -> None:
    with pytest.raises(ConfigurationError) as refused:
        check_storage_url("redis://user:s3cret@h:notaport/0")
    assert "s3cret" not in str(refused.value)
    assert redacted("postgresql://app:p%40ss@db/app") == "postgresql://app:****@db/app"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratelimit", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_peek_and_reset_name_the_option_or_the_variable() -> None:
    """Before: a traceback (``ValueError: Port could not be cast to integer value``)."""
    for command in ("peek", "reset"):
        flag = run(command, "--storage", "redis://h:notaport/0", "--key", "k", "1/s")
        assert flag.returncode == 3, flag.stderr
        assert "--storage='redis://h:notaport/0'" in flag.stderr
        assert "notaport" in flag.stderr
        assert "Traceback" not in flag.stderr
    variable = run("peek", "--key", "k", "1/s", env={"RATELIMIT_STORAGE": "redis://h:notaport/0"})
    assert variable.returncode == 3, variable.stderr
    assert "RATELIMIT_STORAGE='redis://h:notaport/0'" in variable.stderr
    assert "Traceback" not in variable.stderr


def test_the_service_names_the_variable() -> None:
    """Before: the service started and died with a traceback from redis-py."""
    done = run("serve", "--port", "0", env={"RATELIMIT_STORAGE": "redis://h:notaport/0"})
    assert done.returncode == 3, done.stderr
    assert "RATELIMIT_STORAGE='redis://h:notaport/0'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_long_timeout_is_refused_only_where_the_lock_needs_a_longer_ttl() -> None:
    """``lock_ttl`` must outlive ``timeout`` only where the command engine's lock is held:
    Postgres (transaction-scoped locks, released when the statement ends or its connection
    closes) and the script engine (no lock) take any ``timeout``. Before, both were refused
    with a message about ``lock_ttl``, which they have no use for."""
    postgres = RateLimit.from_url(
        "postgresql://app@127.0.0.1:1/app", algorithm="sliding-window", timeout=15
    )
    assert postgres.settings.timeout == 15
    scripts = RateLimit.from_url("redis://127.0.0.1:1/0", timeout=15)
    assert scripts.settings.timeout == 15
    unlocked = RateLimit.from_url(
        "redis://127.0.0.1:1/0", use_scripts=False, disable_locks=True, timeout=15
    )
    assert unlocked.settings.timeout == 15
    with pytest.raises(
        ConfigurationError, match=r"lock_ttl \(10.0 s\) must be longer than timeout"
    ):
        RateLimit.from_url("redis://127.0.0.1:1/0", use_scripts=False, timeout=15)


Store = type[MemoryBackend] | type[RedisScriptBackend] | type[PostgresBackend]
URL_OF: dict[Store, str] = {
    MemoryBackend: "{}://",
    RedisScriptBackend: "{}://127.0.0.1:1/0",
    PostgresBackend: "{}://app@127.0.0.1:1/app",
}


async def test_every_scheme_a_store_declares_opens_that_store() -> None:
    declared = {scheme: store for store in URL_OF for scheme in store.schemes}
    assert set(declared) == set(SCHEMES)
    assert RedisCommandBackend.schemes == RedisScriptBackend.schemes  # one client, two engines
    for scheme in SCHEMES:
        store = declared[scheme]
        url = URL_OF[store].format(scheme)
        if scheme == "unix":
            url = "unix:///tmp/ratelimit-nowhere.sock"
        elif scheme == "redis+sentinel":
            url = "redis+sentinel://127.0.0.1:1/mymaster"
        algorithm = "sliding-window" if store is PostgresBackend else "sliding-log"
        rl = RateLimit.from_url(url, algorithm=algorithm)  # opens a client, connects nowhere
        try:
            assert type(rl.storage) is store, scheme
        finally:
            await rl.aclose()


def test_an_unknown_scheme_is_told_every_scheme_named() -> None:
    with pytest.raises(ConfigurationError, match="unsupported storage URL") as refused:
        check_storage_url("mongodb://h/db")
    named = [*MemoryBackend.schemes, *RedisScriptBackend.schemes, *NAMED]
    assert str(refused.value).endswith(
        f"use {', '.join(f'{s}://' for s in named[:-1])} or {named[-1]}://"
    )
    assert "postgresql://" in str(refused.value)
    assert "redis+sentinel://" in str(refused.value)


async def test_each_store_declares_what_it_can_do() -> None:
    """Every backend of this package says which algorithms it decides, its clock and
    whether it holds concurrency slots, as plain attributes; a backend object of a user's
    that says none of it is read with the defaults (any algorithm, the store's clock, slots
    only with the slot methods)."""

    def clock() -> float:
        return 1.0

    memory = MemoryBackend(clock=clock)
    postgres = PostgresBackend("postgresql://app@127.0.0.1:1/app", clock=clock)
    synced = SyncedBackend(postgres, 1.0, clock=clock)
    for backend in (memory, postgres, synced):
        assert backend.clock is clock
        assert clock_of(backend) is clock
        assert backend.algorithms
        assert backend.algorithms <= {"sliding-log", "sliding-window", "fixed-window", "gcra"}
    assert memory.holds_slots
    assert holds_slots(memory)
    assert RedisScriptBackend.holds_slots
    assert RedisCommandBackend.holds_slots
    assert not postgres.holds_slots
    assert not holds_slots(postgres)
    assert not synced.holds_slots
    assert not holds_slots(synced)
    with pytest.raises(ConfigurationError, match="does not decide algorithm='gcra'"):
        check_supported(postgres, named(GCRA))

    class Yours:
        async def decide(self, plan: object) -> object: ...

    assert clock_of(Yours()) is None
    assert not holds_slots(Yours())
    check_supported(Yours(), named(GCRA))  # trusted
    await synced.aclose()
    await memory.aclose()
