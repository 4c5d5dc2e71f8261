"""``sliding_log_one.lua`` against ``sliding_log.lua`` (the script it shortens for one rule
on one list): the same random calls, on two copies of the same keys, give the same replies
and leave the same lists, companions and times to live; and :func:`plan_command` sends it
exactly where the general script's one-rule branch would run."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest
import redis

from ratelimit.backends.redis.batch import BATCH, batch_command
from ratelimit.backends.redis.resp import Command, Script, pack_args
from ratelimit.backends.redis.scripts import SLIDING_LOG_LUA, SLIDING_LOG_ONE

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

GENERAL = Script(SLIDING_LOG_LUA)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(redis_url)
    for script in (GENERAL, SLIDING_LOG_ONE, BATCH):
        r.script_load(script.source)
    yield r
    r.close()


def _command(script: Script, keys: list[str], argv: tuple[bytes, ...]) -> Command:
    return Command(script, keys, argv, pack_args(argv))


def _run(r: redis.Redis, command: Command) -> object:
    return r.evalsha(command.script.sha.decode(), len(command.keys), *command.keys, *command.args)


def _state(r: redis.Redis, keys: list[str]) -> tuple[object, ...]:
    pttl = [r.pttl(k) for k in keys]
    return (
        r.lrange(keys[0], 0, -1),
        r.get(keys[1]),
        [p if p < 0 else round(p / 1000) for p in pttl],  # whole seconds: both ran just now
    )


def _calls(seed: int) -> Iterator[tuple[bytes, ...]]:
    """Random ARGV of one-rule calls: two counts on one list (a companion that holds the
    other's), costs of 1 to 3 (whole and float), peeks, and a clock that mostly moves on,
    sometimes back, sometimes across a power of ten."""
    rng = random.Random(seed)
    now = rng.choice([9_999_000, 1_000_000_000_000])
    for _ in range(300):
        now = max(1, now + rng.choice([0, 1, 7, 900, 40_000, 300_000, -500, -60_000]))
        count = rng.choice([3, 5, 12])
        span = rng.choice([100_000, 1_000_000, 2_500_000])
        cost = rng.choice([b"1", b"1", b"1", b"2", b"3", b"1.0", b"2.0"])
        record = b"0" if rng.random() < 0.15 else b"1"
        yield (str(now).encode(), f"1 {count} {span} 0 0".encode(), b"1", cost, record)


def _pair(r: redis.Redis, argv: tuple[bytes, ...], one: list[str], general: list[str]) -> None:
    mine = _run(r, _command(SLIDING_LOG_ONE, one, argv))
    theirs = _run(r, _command(GENERAL, general, argv))
    assert mine == theirs, argv
    assert _state(r, one) == _state(r, general), argv


@pytest.mark.parametrize("seed", range(6))
def test_the_one_rule_script_matches_the_general_one(client: redis.Redis, seed: int) -> None:
    tag = uuid.uuid4().hex[:8]
    one, general = [f"{{o{tag}}}:l", f"{{o{tag}}}:l:n"], [f"{{g{tag}}}:l", f"{{g{tag}}}:l:n"]
    for argv in _calls(seed):
        _pair(client, argv, one, general)


def test_on_the_server_clock_and_in_a_batch(client: redis.Redis) -> None:
    """Without an injected time (the server's TIME), and as a call of the batch script
    (the time marked '+'), the same stored state as the general script alone."""
    tag = uuid.uuid4().hex[:8]
    one, general = [f"{{o{tag}}}:l", f"{{o{tag}}}:l:n"], [f"{{g{tag}}}:l", f"{{g{tag}}}:l:n"]
    argv = (b"", b"1 3 60000000 0 0", b"1", b"1", b"1")
    for _ in range(4):
        mine = _run(client, _command(SLIDING_LOG_ONE, one, argv))
        theirs = _run(client, _command(GENERAL, general, argv))
        assert isinstance(mine, list)
        assert isinstance(theirs, list)
        assert (mine[0], mine[2]) == (theirs[0], theirs[2])  # the times are the server's
    assert client.llen(one[0]) == client.llen(general[0]) == 3
    assert _state(client, one)[1:] == _state(client, general)[1:]
    batch = batch_command([_command(SLIDING_LOG_ONE, one, argv), _command(GENERAL, general, argv)])
    replies = _run(client, batch)
    assert isinstance(replies, list)
    assert [reply[:1] + reply[2:3] for reply in replies] == [
        [0, 3],
        [0, 3],
    ]
