"""Which trees spread over a cluster's slots, and the key layout of a spread identifier."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from ratelimit import Settings
from ratelimit.backends.redis.keys import (
    arrival_key,
    counter_key,
    identifier_key,
    kept_key,
    lock_key,
    name_of,
    prefix_of,
    reset_key,
    revoked_key,
    slots_key,
    spread_tag,
    tag,
)
from ratelimit.core.plan import Identifier, compile_tree
from ratelimit.core.slots import claim_for, parse_slots
from ratelimit.rules.tree import Or, Rule, to_tree

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("rules", "spreads"),
    [
        ("user:5/m", True),
        ("user:5/m | user:100/h", True),
        ("user:5/m & user:100/h", True),
        ("user:5/m | user:1000 tokens/m", True),
        ("10/s", False),
        ("apikey:100/h & 10/s", False),
        ("user:5/m | ip:3/m", False),
        (Or(Rule(5, 60_000, "user"), Rule(3, 60_000, "user#1")), False),  # two values
        (Rule(5, 60_000, "user#1"), False),
    ],
)
def test_a_tree_spreads_when_every_rule_names_one_selector(rules: str, spreads: bool) -> None:
    compiled = compile_tree(to_tree(rules))
    assert compiled.spreads is spreads
    assert compiled.pinned is False
    pinned = compile_tree(to_tree(rules), pinned=True)
    assert pinned.spreads is False
    assert pinned.pinned is True  # a key declared pinned: nothing spreads, whatever the shape


def test_one_compiled_instance_per_tree_and_layout() -> None:
    tree = to_tree("user:5/m | user:100/h")
    assert compile_tree(tree) is compile_tree(to_tree("user:5/m | user:100/h"))
    assert compile_tree(tree) is compile_tree(tree, pinned=False)
    assert compile_tree(tree, pinned=True) is compile_tree(tree, True)
    assert compile_tree(tree, pinned=True) is not compile_tree(tree)
    mixed = to_tree("user:5/m & 10/s")  # spans tags where keys spread, unless pinned
    assert compile_tree(mixed, pinned=True) is not compile_tree(mixed)


ALICE = Identifier("shop", "login", "user", "alice")


def test_spread_keys_share_a_tag_of_their_own_per_identifier() -> None:
    rule = to_tree("user:5/m")
    spread = [
        name_of(ALICE, True),
        counter_key(ALICE, True),
        kept_key(ALICE, True),
        arrival_key(ALICE, rule, None, True),  # type: ignore[arg-type]
        reset_key(ALICE, True),
        slots_key(ALICE, True),
        name_of(ALICE._replace(unit="tokens"), True),
        lock_key(spread_tag(ALICE)),
        revoked_key(spread_tag(ALICE), "ab12"),
    ]
    assert spread[0] == "rl:{shop:login:user=alice}"
    assert spread[-3] == "rl:{shop:login:user=alice}!tokens"
    assert len({key_slot(k.encode()) for k in spread}) == 1
    pinned = [name_of(ALICE), counter_key(ALICE), kept_key(ALICE), reset_key(ALICE)]
    assert pinned[0] == identifier_key(ALICE) == "rl:{shop:login}:user=alice"
    assert not set(spread) & set(pinned)
    assert {key_slot(k.encode()) for k in pinned} == {key_slot(tag("shop", "login").encode())}


def test_no_spread_key_is_a_pinned_key_whatever_the_values() -> None:
    # a value full of separators stays inside its own part
    tricky = Identifier("a:b", "c}{", "user", "x}:y={z")
    name = name_of(tricky, True)
    assert name.count("{") == 1
    assert name.count("}") == 1
    assert name != identifier_key(tricky)
    assert name_of(Identifier("shop", "k", None, None), True) == tag("shop", "k")


def test_ten_thousand_users_spread_over_the_slots() -> None:
    slots = {key_slot(name_of(ALICE._replace(value=f"u{i}"), True).encode()) for i in range(10_000)}
    assert len(slots) > 6_000  # of 16 384: spread, where pinned they would all be one


def test_the_prefix_of_a_plan_or_claim() -> None:
    assert prefix_of("shop", "login", (ALICE,), spread=True) == spread_tag(ALICE)
    assert prefix_of("shop", "login", (ALICE,)) == tag("shop", "login")
    assert prefix_of("shop", "login", (), spread=True) == tag("shop", "login")


@pytest.mark.parametrize(
    "limits", ["user:5", "user:5 | user:9", "user:5 | 100", "5", "user:5 | ip:3"]
)
def test_every_concurrency_claim_keeps_the_layout_of_its_identifiers(limits: str) -> None:
    """Issue 47: where a claim's slots live is its identifiers' layout, whatever limits
    name them (a claim spanning tags is taken part by part on a cluster)."""
    claim = claim_for(parse_slots(limits), "shop", "k", {"user": "a", "ip": "1"}, "t", 1000)
    assert claim.spreads


def test_the_spread_setting_is_checked_where_it_is_made() -> None:
    assert Settings().spread is None
    assert Settings(spread=True).spread is True
    with pytest.raises(TypeError, match="spread must be None .*True or False, not 'yes'"):
        Settings(spread="yes")  # type: ignore[arg-type]


def test_memory_takes_no_spread_setting() -> None:
    from ratelimit import RateLimit

    with pytest.raises(TypeError, match="spread=True apply to a Redis client"):
        RateLimit.from_url("memory://", spread=True)


def test_a_lock_timeout_logs_no_selector_value() -> None:
    """A spread lock is named by the caller's value (an API key, perhaps): the message,
    which the failure policy logs, leaves it out; the attribute keeps the whole key."""
    from ratelimit.errors import LockTimeoutError

    lock = lock_key(spread_tag(Identifier("shop", "search", "apikey", "sk_live_123")))
    error = LockTimeoutError(lock, 0.1)
    assert "sk_live_123" not in str(error)
    assert "'rl:{shop:search:apikey=…}:lock'" in str(error)
    assert error.lock == lock
    assert "'rl:{shop:search}:lock'" in str(LockTimeoutError(lock_key(tag("shop", "search")), 1))
