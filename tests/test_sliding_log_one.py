"""``sliding_log_one.lua`` against ``sliding_log.lua`` (the script it shortens for one rule
on one list): the same random calls, on two copies of the same keys, run the same Redis
commands in the same order (read off ``MONITOR``: every expiry to the millisecond), give
the same replies and leave the same lists, companions and times to live; and
:func:`plan_command` sends it exactly where the general script's one-rule branch would
run."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.client import Monitor

from ratelimit.backends.redis.resp import Script
from ratelimit.backends.redis.script.batch import batch_command
from ratelimit.backends.redis.script.scripts import SLIDING_LOG_LUA, SLIDING_LOG_ONE
from tests.script_monitor import command, inside, loaded, run, watching

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

GENERAL = Script(SLIDING_LOG_LUA)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    yield from loaded(redis_url, GENERAL, SLIDING_LOG_ONE)


@pytest.fixture
def monitor(client: redis.Redis) -> Iterator[Monitor]:
    yield from watching(client)


COPIED_MS = 10_000
"""How far apart the times to live the companion copies from its list (``SET K:n c PX t``,
``t`` read by ``PTTL``, so the moment apart the two scripts ran) may be. Every time the
scripts set from the span (``PEXPIRE``, and the ``SET`` after it) is compared exactly."""


def _timeless(command: str) -> str:
    """``command``, the time to live a companion copies from its list left out."""
    return command.rsplit(" ", 1)[0] if command.startswith("SET ") else command


def _state(r: redis.Redis, keys: list[str]) -> tuple[object, ...]:
    """The list and its companion, and whether each has a time to live (how long: compared
    where the scripts set it, through ``MONITOR``)."""
    return (r.lrange(keys[0], 0, -1), r.get(keys[1]), [r.pttl(k) >= 0 for k in keys])


def _calls(seed: int) -> Iterator[tuple[bytes, ...]]:
    """Random ARGV of one-rule calls: two counts on one list (a companion that holds the
    other's), costs of 1 to 3 (whole and float), peeks, and a clock that mostly moves on,
    sometimes back, sometimes across a power of ten. Spans of minutes to an hour: the keys
    outlive the test on Redis's own clock, however slow the machine."""
    rng = random.Random(seed)
    now = rng.choice([9_999_000, 1_000_000_000_000])
    for _ in range(300):
        step = rng.choice([0, 1, 7, 900_000, 40_000_000, 300_000_000, -500, -60_000_000])
        now = max(1, now + step)
        count = rng.choice([3, 5, 12])
        span = rng.choice([100_000_000, 1_000_000_000, 2_500_000_000])
        cost = rng.choice([b"1", b"1", b"1", b"2", b"3", b"1.0", b"2.0"])
        record = b"0" if rng.random() < 0.15 else b"1"
        yield (str(now).encode(), f"1 {count} {span} 0 0".encode(), b"1", cost, record)


def _pair(
    r: redis.Redis, monitor: Monitor, argv: tuple[bytes, ...], one: list[str], general: list[str]
) -> None:
    mine, ran = inside(r, monitor, command(SLIDING_LOG_ONE, one, argv), *one)
    theirs, also = inside(r, monitor, command(GENERAL, general, argv), *general)
    assert mine == theirs, argv
    assert [_timeless(c) for c in ran] == [_timeless(c) for c in also], argv
    copied = [
        (int(a.split()[-1]), int(b.split()[-1])) for a, b in zip(ran, also, strict=True) if a != b
    ]
    assert all(abs(a - b) <= COPIED_MS for a, b in copied), (argv, ran, also)
    assert _state(r, one) == _state(r, general), argv


@pytest.mark.parametrize("seed", range(6))
def test_the_one_rule_script_matches_the_general_one(
    client: redis.Redis, monitor: Monitor, seed: int
) -> None:
    tag = uuid.uuid4().hex[:8]
    one, general = [f"{{o{tag}}}:l", f"{{o{tag}}}:l:n"], [f"{{g{tag}}}:l", f"{{g{tag}}}:l:n"]
    for argv in _calls(seed):
        _pair(client, monitor, argv, one, general)


def test_on_the_server_clock_and_in_a_batch(client: redis.Redis, monitor: Monitor) -> None:
    """Without an injected time (the server's TIME), and as a call of the batch script
    (the time marked '+'), the same stored state as the general script alone."""
    tag = uuid.uuid4().hex[:8]
    one, general = [f"{{o{tag}}}:l", f"{{o{tag}}}:l:n"], [f"{{g{tag}}}:l", f"{{g{tag}}}:l:n"]
    argv = (b"", b"1 3 60000000 0 0", b"1", b"1", b"1")
    for _ in range(4):
        mine, ran = inside(client, monitor, command(SLIDING_LOG_ONE, one, argv), *one)
        theirs, also = inside(client, monitor, command(GENERAL, general, argv), *general)
        assert isinstance(mine, list)
        assert isinstance(theirs, list)
        assert (mine[0], mine[2]) == (theirs[0], theirs[2])  # the times are the server's
        expiring = ("PEXPIRE", "SET")  # what they keep, and for how long: not the time
        assert [c for c in ran if c.startswith(expiring)] == [
            c for c in also if c.startswith(expiring)
        ]
    assert client.llen(one[0]) == client.llen(general[0]) == 3
    assert _state(client, one)[1:] == _state(client, general)[1:]
    batch = batch_command([command(SLIDING_LOG_ONE, one, argv), command(GENERAL, general, argv)])
    replies = run(client, batch)
    assert isinstance(replies, list)
    assert [reply[:1] + reply[2:3] for reply in replies] == [
        [0, 3],
        [0, 3],
    ]
