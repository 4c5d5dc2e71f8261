"""What a settle promises on every store (memory, fakeredis and real Redis on both engines,
PostgreSQL) and algorithm it concerns: a refund gives back only what the reservation still
holds (never capacity that has drained, never across a reset), a cancelled settle is never
lost, and a cost per rule passes the checks a number does (issue 35, items 1-4)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from ratelimit import ConfigurationError, MemoryBackend, SettleError
from ratelimit.algorithms import ALGORITHMS
from ratelimit.core.plan import compile_tree
from ratelimit.rules.tree import to_tree
from tests.conftest import FakeClock, Maker, admitted

pytestmark = pytest.mark.timeout(60)

WINDOWS_AND_GCRA = ["sliding-window", "fixed-window", "gcra"]


# --- item 1: a late GCRA refund gives back nothing that has drained ---


async def test_a_late_gcra_refund_hands_out_no_second_burst(
    make_limiter: Maker, clock: FakeClock
) -> None:
    rl = make_limiter("gcra")
    limit = rl.limit("user:10/h", key="late", user="u")
    reserved = await limit.decide(cost=10)
    assert reserved.allowed
    clock.advance(2 * 3600)  # the reservation has drained: the bucket is full again
    assert (await limit.decide(cost=10)).allowed  # another caller takes the whole burst
    assert await limit.settle(reserved, 0)  # nothing of the reservation still counts
    assert await admitted(limit, 3) == 0


async def test_a_gcra_refund_gives_back_only_what_has_not_drained(
    make_limiter: Maker, clock: FakeClock
) -> None:
    rl = make_limiter("gcra")
    limit = rl.limit("user:10/h", key="part", user="u")
    reserved = await limit.decide(cost=10)
    clock.advance(0.6 * 3600)  # 6 intervals drained: 4 of the 10 still held
    assert (await limit.decide(cost=6)).allowed  # the 6 that came back are taken
    assert await limit.settle(reserved, 0)
    assert await admitted(limit, 6) == 4


# --- item 2: a refund of a call reserved before reset() ---


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_refund_of_a_call_reserved_before_a_reset_takes_nothing_after_it(
    make_limiter: Maker, clock: FakeClock, algorithm: str
) -> None:
    rl = make_limiter(algorithm)
    limit = rl.limit("user:10/h", key="reset", user="u")
    reserved = await limit.decide(cost=10)
    assert reserved.allowed
    clock.advance(1)
    await limit.reset()
    clock.advance(1)
    assert (await limit.decide(cost=10)).allowed  # the limit again, after the reset
    clock.advance(1)
    assert await limit.settle(reserved, 0)  # what it reserved was forgotten already
    assert await admitted(limit, 3) == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_refund_after_a_reset_leaves_hits_before_it_forgotten(
    make_limiter: Maker, clock: FakeClock, algorithm: str
) -> None:
    rl = make_limiter(algorithm)
    limit = rl.limit("user:10/h", key="reset2", user="u")
    reserved = await limit.decide(cost=4)
    clock.advance(1)
    await limit.reset()
    clock.advance(1)
    assert await limit.settle(reserved, 9)  # an excess of 5 is recorded now, reset or not
    assert await admitted(limit, 7) == 5


# --- item 3: a cancelled settle is never lost ---


@pytest.mark.parametrize("algorithm", WINDOWS_AND_GCRA)
async def test_a_settle_cancelled_while_it_is_recorded_happens_and_can_be_made_again(
    make_limiter: Maker, algorithm: str
) -> None:
    rl = make_limiter(algorithm)
    limit = rl.limit("100 tokens/h", key="cancel")
    reserved = await limit.decide(cost={"tokens": 10})
    assert (await limit.decide(cost={"tokens": 1})).allowed
    settling = asyncio.ensure_future(limit.settle(reserved, {"tokens": 90}))
    await asyncio.sleep(0)  # under way: the store is asked
    if settling.cancel():
        with pytest.raises(asyncio.CancelledError):
            await settling
        with pytest.raises(SettleError, match="being settled at"):
            await limit.settle(reserved, {"tokens": 80})  # only at the cost it was settling
        assert await limit.settle(reserved, {"tokens": 90})  # the write it started, done
    else:  # memory:// writes a settle at once, in its first step: nothing was under way
        assert isinstance(rl._decider.backend, MemoryBackend)
        assert settling.result()
    with pytest.raises(SettleError, match="settled already"):
        await limit.settle(reserved, {"tokens": 90})
    assert (await limit.peek(cost={"tokens": 9})).allowed  # 91 of 100 used
    assert not (await limit.peek(cost={"tokens": 10})).allowed


# --- item 4: a cost per rule passes the checks a number does ---


@pytest.mark.parametrize("cost", [(-5,), (math.nan,), (math.inf,), (1.5,), ("5",), (1, 2)])
async def test_a_recorded_cost_per_rule_is_checked_as_a_number_is(
    make_limiter: Maker, cost: tuple[Any, ...]
) -> None:
    rl = make_limiter("gcra")
    compiled = compile_tree(to_tree("user:5/h"))
    with pytest.raises(ConfigurationError):
        await rl.record(compiled, "perrule", ("u",), cost=cost)
    with pytest.raises(ConfigurationError):
        rl.check(compiled, cost)
    limit = rl.limit("user:5/h", key="perrule", user="u")
    assert await admitted(limit, 7) == 5  # nothing was recorded, nothing handed out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_recorded_cost_per_rule_counts_as_given(
    make_limiter: Maker, algorithm: str
) -> None:
    rl = make_limiter(algorithm)
    compiled = compile_tree(to_tree("user:5/h | user:20/d"))
    assert await rl.record(compiled, "perrule2", ("u",), cost=(3, 1))
    limit = rl.limit("user:5/h | user:20/d", key="perrule2", user="u")
    assert await admitted(limit, 4) == 2
