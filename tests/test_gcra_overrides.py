"""GCRA buckets carry on when an override changes the rate of a span (issue 35, item 6):
arrival times are kept per identifier and span, with the count they were stored under, and
a rule of another count rescales what was used (memory, both Redis engines on fakeredis and
a real server)."""

from __future__ import annotations

import fakeredis
import pytest

from ratelimit import RateLimit, Rule
from ratelimit.algorithms import gcra_rescaled
from ratelimit.backends.redis.script.scripts import GENERAL, lua
from tests.conftest import FakeClock, admitted

pytestmark = pytest.mark.timeout(60)

HOUR_US = 3_600_000_000


async def test_raising_a_gcra_rate_leaves_what_was_used_counted(gcra: RateLimit) -> None:
    limit = gcra.limit("user:2/h", key="raise", user="u")
    assert await admitted(limit, 2) == 2
    await gcra.overrides.set("raise", "user:5/h", user="u")
    assert await admitted(limit, 10) == 3  # 5 in all, not 5 more


async def test_lowering_a_gcra_rate_gives_an_abuser_nothing_more(
    gcra: RateLimit, clock: FakeClock
) -> None:
    limit = gcra.limit("user:5/h", key="lower", user="u")
    assert await admitted(limit, 5) == 5
    await gcra.overrides.set("lower", "user:2/h", user="u")
    assert await admitted(limit, 5) == 0  # the first decision under 2/h rescales: 5 used
    clock.advance(0.75 * 3600)  # 5 used at 2/h: 1.5 of them drained
    assert await admitted(limit, 5) == 0  # 3.5 of 2 still used
    clock.advance(0.75 * 3600 + 1)  # 3 drained: 2 used of 2, then one more interval
    assert await admitted(limit, 5) == 0
    clock.advance(0.5 * 3600)
    assert await admitted(limit, 5) == 1


async def test_back_to_the_first_rate_the_bucket_is_as_it_was(gcra: RateLimit) -> None:
    limit = gcra.limit("user:3/h", key="back", user="u")
    assert await admitted(limit, 1) == 1
    await gcra.overrides.set("back", "user:6/h", user="u")
    assert await admitted(limit, 2) == 2  # 3 used of 6
    await gcra.overrides.delete("back", user="u")
    assert await admitted(limit, 3) == 0  # 3 used of 3


async def test_another_burst_on_the_same_span_shares_the_bucket(gcra: RateLimit) -> None:
    limit = gcra.limit("user:4/h", key="burst", user="u")
    assert await admitted(limit, 3) == 3
    await gcra.overrides.set("burst", "user:4/h burst 6", user="u")
    assert await admitted(limit, 10) == 3  # 6 at once now, 3 of them used


async def test_two_counts_of_one_span_in_one_tree_share_one_bucket(
    gcra: RateLimit, clock: FakeClock
) -> None:
    limit = gcra.limit("user:2/h | user:4/h", key="both", user="u")
    assert await admitted(limit, 6) == 2  # both count: 2/h binds
    clock.advance(0.5 * 3600)  # one drained of 2/h (two of 4/h)
    assert await admitted(limit, 3) == 1
    clock.advance(0.5 * 3600)  # one more of 2/h; 4/h has 2 used of 4
    assert await admitted(limit, 3) == 1


async def test_a_rule_added_in_front_of_a_span_reads_what_was_used(gcra: RateLimit) -> None:
    limit = gcra.limit("user:3/h", key="front", user="u")
    assert await admitted(limit, 5) == 3
    await gcra.overrides.set("front", "user:10/h | user:3/h", user="u")
    assert await admitted(limit, 10) == 0  # 3 of 3/h used, whichever rule comes first
    await gcra.overrides.delete("front", user="u")
    assert await admitted(limit, 10) == 0


async def test_reordering_or_reshaping_the_rules_of_a_span_forgets_nothing(
    gcra: RateLimit,
) -> None:
    limit = gcra.limit("user:3/h | user:10/h", key="order", user="u")
    assert await admitted(limit, 5) == 3
    await gcra.overrides.set("order", "user:10/h | user:3/h", user="u")
    assert await admitted(limit, 10) == 0
    await gcra.overrides.set("order", "user:10/h | user:3/h burst 2", user="u")
    assert await admitted(limit, 10) == 0


async def test_a_looser_rule_of_the_span_added_beside_a_tight_burst_forgets_nothing(
    gcra: RateLimit, clock: FakeClock
) -> None:
    limit = gcra.limit("user:10/h burst 2", key="tight", user="u")
    assert await admitted(limit, 5) == 2
    await gcra.overrides.set("tight", "user:5/h burst 20 | user:10/h burst 2", user="u")
    assert await admitted(limit, 5) == 0  # 2 used: the burst of 2 is spent
    clock.advance(12 * 60 + 1)  # one interval of 5/h: one hit drained at the slower rate
    assert await admitted(limit, 5) == 1


@pytest.mark.parametrize(
    ("stored", "count", "tat", "expected"),
    [
        (2, 5, (HOUR_US, 0), (720_000_000 * 2, 0)),  # 2 used of 2/h: 2 of 5/h
        (5, 2, (HOUR_US, 0), (1_800_000_000 * 5, 0)),  # 5 used of 5/h: 5 of 2/h
        (3, 7, (1, 2), (0, 5)),  # 1 2/3 us ahead under 3: 5/7 us under 7
        (3, 3, (10, 1), (10, 1)),  # the same count: as it was
        (3, 7, (0, 0), (0, 0)),  # nothing ahead: nothing held
    ],
)
def test_rescaling_carries_the_hits_held_exactly(
    stored: int, count: int, tat: tuple[int, int], expected: tuple[int, int]
) -> None:
    rule = Rule(count, 3_600_000)
    assert gcra_rescaled(rule, tat, stored, 0) == expected


def test_rescaling_holds_ten_years_ahead_at_most() -> None:
    rule = Rule(1, 3650 * 86_400_000)
    rescaled = gcra_rescaled(rule, (10**12, 0), 1_000_000_000, 0)
    assert rescaled == (3650 * 86_400_000_000, 0)


def _rescale_cases() -> list[tuple[int, int, int, int]]:
    return [(10**9, 7, 10**12, 5), (7, 10**9, 10**12, 3), (999_983, 1_000_003, 10**11, 1)]


@pytest.mark.parametrize(("stored", "count", "ahead", "remainder"), _rescale_cases())
async def test_the_script_rescales_as_python_does(
    stored: int, count: int, ahead: int, remainder: int, clock: FakeClock
) -> None:
    """``_gcra.lua`` and :func:`gcra_rescaled` agree, past 2**53 too."""
    script = lua(*GENERAL, "_gcra.lua") + "\nreturn {read_arrival(KEYS[1], tonumber(ARGV[2]))}"
    client = fakeredis.FakeAsyncRedis()
    try:
        now = 1_700_000_000_000_000
        await client.set("k", f"{now + ahead}:{remainder % stored}:{stored}")
        got = await client.eval(script, 1, "k", str(now), str(count))
        rule = Rule(count, 3_600_000)
        expected = gcra_rescaled(rule, (now + ahead, remainder % stored), stored, now)
        assert (int(got[0]), int(got[1])) == expected
    finally:
        await client.aclose()
