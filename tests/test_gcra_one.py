"""``gcra_one.lua`` against ``gcra.lua`` (the script it shortens for one rule on one arrival
time): the same random calls, on two copies of the same key, run the same Redis commands in
the same order (read off ``MONITOR``: the stored string and its ``PX`` to the millisecond),
give the same replies and leave the same strings and times to live; and
:func:`plan_command` sends it exactly where the general script's one-rule branch would run."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.client import Monitor

from ratelimit.algorithms import GCRA, SLIDING_LOG
from ratelimit.backends.redis.resp import Script
from ratelimit.backends.redis.script.batch import BATCHED, batch_command
from ratelimit.backends.redis.script.scripts import (
    BY_ALGORITHM,
    GCRA_LUA,
    GCRA_ONE,
    plan_command,
    spread_command_of,
)
from ratelimit.core.plan import cached_plan, compile_tree
from ratelimit.rules.tree import to_tree
from tests.conftest import FakeClock
from tests.script_monitor import command, inside, loaded, run, watching

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

GENERAL = Script(GCRA_LUA)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    yield from loaded(redis_url, GENERAL, GCRA_ONE)


@pytest.fixture
def monitor(client: redis.Redis) -> Iterator[Monitor]:
    yield from watching(client)


SOON_MS = 20_000
"""A key about to expire on Redis's clock (written on the server's instant, '+') may go
before its twin does: both are dropped then (what a script wrote, and its PX, are
compared exactly through ``MONITOR``), so that no call reads one and not the other."""


def _same_state(r: redis.Redis, one: str, general: str) -> bool:
    """The same string, and times to live a moment apart (a key neither script wrote
    just now kept an older PX, compared when it was written)."""
    ttl, also = r.pttl(one), r.pttl(general)
    if 0 <= min(ttl, also) < SOON_MS or (-2 in (ttl, also) and max(ttl, also) < SOON_MS):
        r.delete(one, general)
        return True
    same_ttl = ttl == also if min(ttl, also) < 0 else abs(ttl - also) <= 1000
    return r.get(one) == r.get(general) and same_ttl


def _calls(seed: int) -> Iterator[tuple[bytes, ...]]:
    """Random ARGV of one-rule calls on one arrival time: counts, spans and bursts mixed (a
    time stored under another count is rescaled), costs of 0 to 3 (whole and float, some
    past the burst), peeks, and a clock that mostly moves on, sometimes back or far ahead;
    now and then the batch's server instant ('+': not injected, kept as on Redis's clock)."""
    rng = random.Random(seed)
    now = rng.choice([9_999_000, 1_000_000_000_000, 1_764_000_000_000_000])
    for _ in range(300):
        now = max(1, now + rng.choice([0, 1, 7, 900, 40_000, 300_000, 9_000_000, -500, -60_000]))
        count = rng.choice([1, 3, 7, 10, 1000])
        span = rng.choice([1_000_000, 999_999, 60_000_000, 7, 86_400_000_000])
        burst = rng.choice([1, count, count, 2 * count + 1])
        cost = rng.choice([b"1", b"1", b"1", b"2", b"3", b"1.0", b"2.0", b"0"])
        record = b"0" if rng.random() < 0.15 else b"1"
        time = str(now).encode()
        if rng.random() < 0.2:
            time = b"+" + time
        yield (time, f"1 {count} {span} 0 0".encode(), b"1", cost, record, str(burst).encode())


def _pair(
    r: redis.Redis, monitor: Monitor, argv: tuple[bytes, ...], one: str, general: str
) -> None:
    mine = inside(r, monitor, command(GCRA_ONE, [one], argv), one)
    theirs = inside(r, monitor, command(GENERAL, [general], argv), general)
    assert mine == theirs, argv
    assert _same_state(r, one, general), argv


@pytest.mark.parametrize("seed", range(6))
def test_the_one_rule_script_matches_the_general_one(
    client: redis.Redis, monitor: Monitor, seed: int
) -> None:
    tag = uuid.uuid4().hex[:8]
    one, general = f"{{o{tag}}}:g:60000", f"{{g{tag}}}:g:60000"
    rng = random.Random(-seed)
    for argv in _calls(seed):
        if rng.random() < 0.04:  # what earlier versions stored (no count, or no remainder),
            # or a time so far ahead under another count that its rescale stops at ten years
            now = int(argv[0].lstrip(b"+"))
            old = rng.choice(["0", "5", f"{now + 900_000}", "12:1", f"{now + 10**13}:0:1000"])
            for key in (one, general):
                client.set(key, old, px=3_600_000)
        _pair(client, monitor, argv, one, general)


@pytest.mark.parametrize("count", [1, 7, 1000])
def test_stored_times_far_ahead(client: redis.Redis, monitor: Monitor, count: int) -> None:
    """Times stored under another count so far ahead that rescaling them leaves exact
    doubles (past 2**53 in 1/count of a microsecond) or stops at ten years."""
    tag = uuid.uuid4().hex[:8]
    one, general = f"{{o{tag}}}:g:60000", f"{{g{tag}}}:g:60000"
    now = 1_764_000_000_000_000
    for stored in ("1:0:3", f"{now + 10**15 + 1}:0:10", f"{now + 10**13}:7:1000", f"{now}:1:3"):
        for burst, record in ((count, b"1"), (1, b"0"), (count, b"1")):
            for key in (one, general):
                client.set(key, stored, px=3_600_000)
            argv = (str(now).encode(), f"1 {count} 60000000 0 0".encode(), b"1", b"1", record)
            _pair(client, monitor, (*argv, str(burst).encode()), one, general)


def test_on_the_server_clock_and_in_a_batch(client: redis.Redis, monitor: Monitor) -> None:
    """Without an injected time (the server's TIME), and as a call of the batch script
    (the time marked '+'), the same commands and stored count as the general script."""
    tag = uuid.uuid4().hex[:8]
    one, general = f"{{o{tag}}}:g:60000", f"{{g{tag}}}:g:60000"
    argv = (b"", b"1 3 60000000 0 0", b"1", b"1", b"1", b"3")
    for allowed in (1, 1, 1, 0):
        mine, ran = inside(client, monitor, command(GCRA_ONE, [one], argv), one)
        theirs, also = inside(client, monitor, command(GENERAL, [general], argv), general)
        assert isinstance(mine, list)
        assert isinstance(theirs, list)
        assert mine[0] == theirs[0] == allowed  # the times are the server's
        assert [c.split()[0] for c in ran] == [c.split()[0] for c in also]
    stored, also_stored = client.get(one), client.get(general)
    assert isinstance(stored, bytes)
    assert isinstance(also_stored, bytes)
    assert stored.split(b":")[2] == also_stored.split(b":")[2] == b"3"
    ttl, also_ttl = client.pttl(one), client.pttl(general)
    assert 50_000 < ttl <= 60_000
    assert abs(ttl - also_ttl) < 1000
    # in one batch the two share the server's instant ('+'): the same to the microsecond
    client.delete(one, general)
    batch = batch_command([command(GCRA_ONE, [one], argv), command(GENERAL, [general], argv)])
    for allowed in (1, 1, 1, 0):
        replies, ran = inside(client, monitor, batch, one, general)
        assert isinstance(replies, list)
        first = replies[0]
        assert isinstance(first, list)
        assert first == replies[1]
        assert first[0] == allowed
        assert ran[: len(ran) // 2] == ran[len(ran) // 2 :]
        assert client.get(one) == client.get(general)
    # two calls of it on one key in a batch, on an injected clock: each as alone
    client.delete(one, general)
    timed = (b"5000000", b"1 3 60000000 0 0", b"1", b"1", b"1", b"3")
    twice = run(client, batch_command([command(GCRA_ONE, [one], timed)] * 2))
    alone = [run(client, command(GENERAL, [general], timed)) for _ in range(2)]
    assert twice == alone
    assert _same_state(client, one, general)


def test_plan_command_sends_it_for_one_resolved_rule() -> None:
    """One rule whose selector resolved: ``gcra_one.lua``, pinned or spread, on any clock;
    two rules, or a selector that did not resolve: ``gcra.lua``. Batched either way."""
    assert GCRA_ONE in BATCHED
    assert BY_ALGORITHM[GCRA].one is GCRA_ONE
    assert BY_ALGORITHM[SLIDING_LOG].one is not GCRA_ONE
    one = cached_plan(compile_tree(to_tree("user:5/m")), "ns", "k", ("alice",), 1, GCRA)
    two = cached_plan(compile_tree(to_tree("user:5/m & user:50/h")), "ns", "k", ("a",), 1, GCRA)
    same_span = cached_plan(
        compile_tree(to_tree("user:5/m & ip:9/m")), "ns", "k", ("a", "b"), 1, GCRA
    )
    unresolved = cached_plan(compile_tree(to_tree("user:5/m")), "ns", "k", (None,), 1, GCRA)
    assert plan_command(one).script is GCRA_ONE
    assert plan_command(one, FakeClock()).script is GCRA_ONE
    assert spread_command_of(one).script is GCRA_ONE
    for plan in (two, same_span, unresolved):
        assert plan_command(plan).script.sha == GENERAL.sha
