"""Redis keys: distinct identifiers never share a key, keys stay short, have TTLs, one slot."""

from __future__ import annotations

import itertools

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from ratelimit import RateLimit, RedisScriptBackend
from ratelimit.backends.redis.keys import MAX_PART, encode_part, identifier_key, tag
from ratelimit.core.plan import Identifier, cached_plan, compile_tree
from ratelimit.rules.tree import Or, Rule
from tests.conftest import FakeClock

AWKWARD = [
    "vova",
    "a:b",
    "a%3Ab",
    "a b",
    "a{b}",
    "{",
    "}",
    "{}",
    "}{",
    "=",
    "a=b",
    "#",
    "#" + "0" * 32,
    "%",
    "%25",
    "ü",
    "日本語",
    "\udcff",
    "\x00",
    "line\nbreak",
    "x" * MAX_PART,
    "x" * (MAX_PART + 1),
    "x" * 10_000,
    "x" * 9_999 + "y",
    "y" + "x" * 9_999,
]


def test_awkward_values_never_share_a_key() -> None:
    keys = {identifier_key(Identifier("ns", "k", "user", v)) for v in AWKWARD}
    assert len(keys) == len(AWKWARD)


def test_namespace_key_selector_boundaries_never_blur() -> None:
    parts = ["", "a", "b", "a:b", "b:c", ":", "a}", "{a", "user=x"]
    identifiers = {
        Identifier(ns, key, selector, value)
        for ns, key in itertools.product(parts, repeat=2)
        for selector, value in [(None, None), ("user", "x"), ("user", "x:y"), ("u", "ser=x")]
    }
    keys = {identifier_key(i) for i in identifiers}
    assert len(keys) == len(identifiers)


@pytest.mark.parametrize("algorithm", ["sliding-log", "sliding-window", "gcra"])
def test_a_selector_written_name_hash_n_counts_on_the_identifiers_of_name(algorithm: str) -> None:
    """``user#1`` is another occurrence of ``user`` with a value of its own: where a
    selector sits in a tree never gives it another counter."""
    hour = 3_600_000
    tree = Or(Rule(2, hour, "user"), Rule(2, hour, "user#1"), Rule(5, hour, "user#2"))
    plan = cached_plan(compile_tree(tree), "ns", "k", ("x", "y", "x"), 1, algorithm)
    assert plan.identifiers == (
        Identifier("ns", "k", "user", "x"),
        Identifier("ns", "k", "user", "y"),
    )
    assert plan.leaf_identifiers == (0, 1, 0)
    alone = cached_plan(compile_tree(Rule(2, hour, "user#1")), "ns", "k", ("y",), 1, algorithm)
    first = cached_plan(compile_tree(Rule(2, hour, "user")), "ns", "k", ("y",), 1, algorithm)
    assert alone.identifiers == first.identifiers == (Identifier("ns", "k", "user", "y"),)
    assert len({identifier_key(i) for i in plan.identifiers}) == 2


def test_long_parts_become_digests_so_keys_stay_bounded() -> None:
    key = identifier_key(Identifier("n" * 5000, "k" * 5000, "user", "v" * 10_000))
    assert len(key) < 3 * (MAX_PART + 2) + 16
    assert encode_part("v" * 10_000).startswith("#")
    assert len(encode_part("v" * 10_000)) == 33  # '#' and 128 bits in hex


def test_every_key_of_one_limit_has_one_hash_tag_and_one_slot() -> None:
    slots = {
        key_slot(identifier_key(Identifier("shop", "cats", "user", v)).encode()) for v in AWKWARD
    }
    slots.add(key_slot(identifier_key(Identifier("shop", "cats", None, None)).encode()))
    assert len(slots) == 1


def test_readable_layout() -> None:
    assert identifier_key(Identifier("shop", "app.search", None, None)) == "rl:{shop:app.search}"
    assert (
        identifier_key(Identifier("shop", "login", "username", "vova"))
        == "rl:{shop:login}:username=vova"
    )
    assert identifier_key(Identifier("", "login", "ip", "::1")) == "rl:{:login}:ip=%3A%3A1"


@pytest.mark.redis
async def test_real_redis_keys_are_distinct_bounded_and_expire(
    redis_client: aioredis.Redis, namespace: str
) -> None:
    rl = RateLimit(redis_client, namespace)
    for value in AWKWARD:
        if value:
            decision = await rl.limit("user:1/m | 100/h", key="awkward", user=value).decide()
            assert decision.allowed, value
    keys = [k async for k in redis_client.scan_iter(match=f"rl:{{{namespace}:*", count=1000)]
    # a log and its ":n" companion per value, and for the selector-less 100/h
    assert len(keys) == 2 * (len(AWKWARD) + 1)
    assert len({key_slot(k) for k in keys}) == 1
    for key in keys:
        assert len(key) < 200
        ttl = await redis_client.pttl(key)
        assert 0 < ttl <= 2 * 3_600_000  # one to two of the largest span sharing the key
    plain = f"rl:{{{namespace}:awkward}}".encode()
    assert await redis_client.llen(plain) == len(AWKWARD)


@pytest.mark.redis
async def test_real_redis_logs_are_trimmed_to_the_largest_count(
    redis_client: aioredis.Redis, namespace: str
) -> None:
    clock = FakeClock()
    rl = RateLimit(RedisScriptBackend(redis_client, clock=clock), namespace)
    limit = rl.limit("2/s | 3/m", key="trim")
    for _ in range(10):
        assert (await limit.decide()).allowed
        clock.advance(60)
    assert await redis_client.llen(f"rl:{{{namespace}:trim}}") == 3


@pytest.mark.redis
async def test_real_redis_ttl_is_never_shortened_by_a_shorter_rule(
    redis_client: aioredis.Redis, namespace: str
) -> None:
    rl = RateLimit(redis_client, namespace)
    for rules in ("user:100/h", "user:3/s"):  # one place: one key, whatever its rules
        decision = await rl.limit(rules, user="v").decide()
    key = f"{tag(namespace, decision.key)}:user=v"  # a long key: a digest
    assert await redis_client.pttl(key) > 3_500_000


async def test_fakeredis_backend_uses_the_same_keys(namespace: str) -> None:
    import fakeredis

    client = fakeredis.FakeAsyncRedis()
    rl = RateLimit(RedisScriptBackend(client), namespace)
    await rl.limit("user:1/m", key="login", user="a:b").decide()
    assert await client.exists(f"rl:{{{namespace}:login}}:user=a%3Ab")
    await client.aclose()
