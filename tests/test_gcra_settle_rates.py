"""A GCRA settle after an override changed the rate (issue 35, red team's findings A and C):
the settle applies its hits to the bucket at the count it is stored under now, never brings
back the reservation's rate, and writes nothing when it changes nothing, the same on every
store (memory, both Redis engines on fakeredis and a real server)."""

from __future__ import annotations

import pytest

from ratelimit import RateLimit, Rule
from ratelimit.algorithms import gcra_settled
from tests.conftest import FakeClock, admitted

pytestmark = pytest.mark.timeout(60)


async def test_a_refund_after_the_rate_was_lowered_keeps_the_lower_rate(
    gcra: RateLimit, clock: FakeClock
) -> None:
    limit = gcra.limit("user:100000/h", key="lowered", user="u")
    first = await limit.decide(cost=100)
    await gcra.overrides.set("lowered", "user:100/h", user="u")
    assert await admitted(limit, 5) == 0  # 100 of 100/h used
    assert await limit.settle(first, 99)  # a refund of 1: 99 of 100/h used
    clock.advance(5)
    assert await admitted(limit, 200) == 1  # not 100/h drained at 100000/h
    clock.advance(30)  # 35 s of an interval of 36 s since the refund
    assert await admitted(limit, 5) == 0
    clock.advance(1.5)
    assert await admitted(limit, 5) == 1


async def test_a_refund_after_a_raising_override_was_deleted_keeps_the_base_rate(
    gcra: RateLimit, clock: FakeClock
) -> None:
    limit = gcra.limit("user:100/h", key="deleted", user="u")
    await gcra.overrides.set("deleted", "user:100000/h", user="u")
    first = await limit.decide(cost=100)
    await gcra.overrides.delete("deleted", user="u")
    assert await admitted(limit, 5) == 0  # 100 of 100/h used
    assert await limit.settle(first, 99)
    clock.advance(5)
    assert await admitted(limit, 200) == 1


async def test_a_refund_on_a_two_per_hour_base_gives_back_one_hit_of_it(
    gcra: RateLimit, clock: FakeClock
) -> None:
    limit = gcra.limit("user:2/h", key="two", user="u")
    await gcra.overrides.set("two", "user:100000/h", user="u")
    first = await limit.decide(cost=2)
    await gcra.overrides.delete("two", user="u")
    assert await admitted(limit, 5) == 0  # 2 of 2/h used
    assert await limit.settle(first, 1)  # 1 of 2/h used
    clock.advance(5)
    assert await admitted(limit, 5) == 1


async def test_an_excess_after_the_rate_was_lowered_is_counted_at_the_lower_rate(
    gcra: RateLimit, clock: FakeClock
) -> None:
    limit = gcra.limit("user:2/h", key="excess", user="u")
    await gcra.overrides.set("excess", "user:100000/h", user="u")
    first = await limit.decide()
    await gcra.overrides.delete("excess", user="u")
    clock.advance(40)  # the reserved hit drained at 100000/h
    assert await admitted(limit, 5) == 2  # 2 of 2/h
    assert await limit.settle(first, 2)  # one more: 3 of 2/h
    clock.advance(120)
    assert await admitted(limit, 5) == 0  # not drained at 100000/h
    clock.advance(3600 - 160)  # 1.98 of 3 drained: without the excess, 1 would pass
    assert await admitted(limit, 5) == 0
    clock.advance(60)  # 2.01 of 3 drained
    assert await admitted(limit, 5) == 1


async def test_a_refund_that_returns_nothing_writes_nothing(
    gcra: RateLimit, clock: FakeClock
) -> None:
    """The bucket stays as the last decision left it (under 1000/h, which a quiet key
    drains at until its next decision: docs/tenants.md), on every store alike."""
    limit = gcra.limit("user:4/h", key="nothing", user="u")
    first = await limit.decide()
    clock.advance(1800)  # the first hit drained
    assert await admitted(limit, 3) == 3
    await gcra.overrides.set("nothing", "user:1000/h", user="u")
    assert await admitted(limit, 2) == 2  # 3 rescaled and 2: 5 of 1000/h
    await gcra.overrides.delete("nothing", user="u")
    assert await limit.settle(first, 0)  # its hit drained long ago: nothing to refund
    clock.advance(1800)
    assert await admitted(limit, 10) == 4


async def test_a_drained_refund_after_the_rate_was_lowered_leaves_the_lower_rate(
    gcra: RateLimit, clock: FakeClock
) -> None:
    limit = gcra.limit("user:2/h", key="drained", user="u")
    await gcra.overrides.set("drained", "user:100/h", user="u")
    first = await limit.decide()
    await gcra.overrides.delete("drained", user="u")
    clock.advance(40)  # the reserved hit drained at 100/h
    assert await admitted(limit, 5) == 2  # 2 of 2/h
    assert await limit.settle(first, 0)  # nothing left to refund
    clock.advance(120)
    assert await admitted(limit, 5) == 0  # still 2/h: not written back under 100/h


async def test_an_excess_capped_at_ten_years_reads_alike_on_every_store(
    gcra: RateLimit,
) -> None:
    limit = gcra.limit("user:4/h", key="capped", user="u")
    await gcra.overrides.set("capped", "user:3/3650d burst 3", user="u")
    first = await limit.decide()
    await gcra.overrides.set("capped", "user:7/3650d", user="u")
    assert await admitted(limit, 3, cost=2) == 3  # 1 rescaled and 6: 7 of 7
    assert await limit.settle(first, 2**53 + 1)  # ten years ahead at 7 per 3650 days
    assert await admitted(limit, 5) == 0


async def test_a_refund_on_rules_of_one_span_gives_back_to_their_shared_bucket(
    gcra: RateLimit, clock: FakeClock
) -> None:
    limit = gcra.limit("user:10/h | user:3/h", key="shared", user="u")
    first = await limit.decide(cost=3)
    assert await admitted(limit, 5) == 0  # 3 of 3/h used
    assert await limit.settle(first, 1)  # 1 of 3/h used
    assert await admitted(limit, 5) == 2
    clock.advance(20 * 60 + 1)  # one interval of 3/h: the bucket drains at the slower rate
    assert await admitted(limit, 5) == 1


def test_a_settle_counts_its_hits_at_the_stored_count() -> None:
    rule = Rule(100_000, 3_600_000)  # the reservation's; the bucket is stored under 100/h
    now = 10**12
    stored = (now + 3_600_000_000, 0)  # 100 of 100/h used
    held = (now + 3_600_000, 0)  # the reservation's 100 hits at 100000/h
    assert gcra_settled(rule, stored, -1, now, held, 100) == (now + 3_564_000_000, 0)
    assert gcra_settled(rule, stored, 1, now, held, 100) == (now + 3_636_000_000, 0)
    drained = (now - 1, 0)
    assert gcra_settled(rule, stored, -1, now, drained, 100) == stored
