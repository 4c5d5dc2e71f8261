"""Costs decided per call and settled after it (``cost=`` callables and unit mappings,
``settle=``, ``Limit.settle``), on every backend of the conftest and every algorithm."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest

from ratelimit import (
    BackendError,
    ConfigurationError,
    MemoryBackend,
    RateLimit,
    RateLimitExceeded,
    Rule,
    RuleSyntaxError,
    SettleError,
)
from ratelimit.algorithms import ALGORITHMS
from ratelimit.core.plan import compile_tree
from ratelimit.core.settling import by_leaf, settlement
from ratelimit.rules.tree import to_tree
from tests.conftest import BackendFactory, FakeClock, supporting

ALGORITHM = pytest.mark.parametrize("algorithm", ALGORITHMS)
REQUESTS_AND_TOKENS = "api:3/m | api:100 tokens/m"


def limiter(make_backend: BackendFactory, clock: FakeClock, algorithm: str, **kw: Any) -> RateLimit:
    backend = supporting(make_backend(clock), algorithm)
    return RateLimit(backend, f"settle-{uuid.uuid4().hex[:8]}", algorithm=algorithm, **kw)


def left(decision: Any) -> list[tuple[str, int]]:
    return [(str(s.rule), s.remaining) for s in decision.states]


# --- rules that count a unit ---


@pytest.mark.parametrize(
    ("text", "unit"),
    [
        ("apikey:90000 tokens/m", "tokens"),
        ("90000 tokens per minute", "tokens"),
        ("5 bytes/s burst 9", "bytes"),
        ("10r/s", None),
        ("10 r/s", None),
        ("10/s", None),
    ],
)
def test_a_rule_names_what_it_counts_and_str_parses_back(text: str, unit: str | None) -> None:
    tree = to_tree(text)
    assert isinstance(tree, Rule)
    assert tree.unit == unit
    assert to_tree(str(tree)) == tree


def test_a_tree_of_units_prints_and_parses_back() -> None:
    tree = to_tree("apikey:60/m | apikey:90000 tokens/m & (1000 rows/h | 5/s)")
    assert str(tree) == "apikey:60/m | (apikey:90000 tokens/m & (1000 rows/h | 5/s))"
    assert to_tree(str(tree)) == tree


@pytest.mark.parametrize("text", ["10 per/s", "10 burst/s", "10 tokens tokens/s", "10 tok-ens/s"])
def test_a_bad_unit_is_a_syntax_error_with_its_column(text: str) -> None:
    with pytest.raises(RuleSyntaxError) as error:
        to_tree(text)
    assert error.value.column is not None


def test_a_unit_made_by_hand_is_checked() -> None:
    with pytest.raises(RuleSyntaxError, match="unit must be a word"):
        Rule(10, 1000, unit="per")
    with pytest.raises(RuleSyntaxError, match="unit must be a word"):
        Rule(10, 1000, unit="two words")


@ALGORITHM
async def test_calls_and_tokens_count_apart_and_a_refusal_counts_on_neither(
    make_backend: BackendFactory, clock: FakeClock, algorithm: str
) -> None:
    rl = limiter(make_backend, clock, algorithm)
    first = await limit_for(rl).decide(cost={"tokens": 60})
    assert first.allowed
    assert left(first) == [("api:3/m", 2), ("api:100 tokens/m", 40)]
    refused = await limit_for(rl).decide(cost={"tokens": 41})  # too many tokens
    assert not refused.allowed
    assert str(refused.rule) == "api:100 tokens/m"
    after = await limit_for(rl).peek(cost={"tokens": 40})
    assert after.allowed
    assert left(after) == [("api:3/m", 1), ("api:100 tokens/m", 0)]  # the refusal: nothing


def limit_for(rl: RateLimit, **kw: Any) -> Any:
    return rl.limit(REQUESTS_AND_TOKENS, key="llm", api="k", **kw)


def test_a_cost_mapping_must_name_every_unit_and_no_other() -> None:
    rl = RateLimit(MemoryBackend())
    with pytest.raises(ConfigurationError, match="no amount for unit 'tokens'"):
        rl.limit(REQUESTS_AND_TOKENS, key="a", cost={})
    with pytest.raises(ConfigurationError, match="unit 'rows', which no rule"):
        rl.limit(REQUESTS_AND_TOKENS, key="b", cost={"tokens": 1, "rows": 2})
    with pytest.raises(ConfigurationError, match="unit 'tokens', which no rule"):
        rl.limit("5/s", key="c", cost={"tokens": 1})
    with pytest.raises(ConfigurationError, match=r"cost\['tokens'\]"):
        rl.limit(REQUESTS_AND_TOKENS, key="d", cost={"tokens": 1.5})  # sliding log: whole
    with pytest.raises(ConfigurationError, match="above the count"):
        rl.limit(REQUESTS_AND_TOKENS, key="e", cost={"tokens": 101})
    with pytest.raises(ConfigurationError, match="must be a number, a mapping"):
        rl.limit(REQUESTS_AND_TOKENS, key="f", cost="12")  # type: ignore[call-overload]


async def test_a_number_as_cost_counts_on_every_rule_as_before() -> None:
    rl = RateLimit(MemoryBackend())
    decision = await rl.limit(REQUESTS_AND_TOKENS, key="n", cost=2, api="k").decide()
    assert left(decision) == [("api:3/m", 1), ("api:100 tokens/m", 98)]


# --- costs from the call ---


async def test_a_cost_callable_gets_the_call_s_own_arguments() -> None:
    rl = RateLimit(MemoryBackend())
    seen = []

    def estimate(api: str, prompt: str, max_tokens: int = 10) -> dict[str, int]:
        seen.append((api, prompt, max_tokens))
        return {"tokens": max_tokens}

    @rl.limit("api:100 tokens/m", cost=estimate)
    async def complete(api: str, prompt: str, max_tokens: int = 10) -> str:
        return prompt

    assert await complete("k", "hi", max_tokens=60) == "hi"
    assert await complete("k", prompt="yo") == "yo"
    with pytest.raises(RateLimitExceeded):
        await complete("k", "no", 31)  # 70 used: 31 more would pass 100
    assert seen == [("k", "hi", 60), ("k", "yo", 10), ("k", "no", 31)]


async def test_an_async_cost_callable_is_awaited_and_its_answer_checked() -> None:
    rl = RateLimit(MemoryBackend())

    async def estimate(n: int) -> int:
        await asyncio.sleep(0)
        return n

    @rl.limit("5/m", cost=estimate)
    async def work(n: int) -> None:
        return None

    await work(3)
    with pytest.raises(RateLimitExceeded):
        await work(3)
    with pytest.raises(ConfigurationError, match="the cost .*estimate returned"):
        await work(0)  # not a cost the sliding log counts


async def test_decide_acquire_and_peek_take_a_cost_for_one_call() -> None:
    rl = RateLimit(MemoryBackend())
    limit = rl.limit("10/m", key="one")
    assert (await limit.peek(cost=10)).allowed
    assert (await limit.decide(cost=4)).remaining == 6
    assert (await limit.acquire(cost=6)).remaining == 0
    assert not (await limit.decide()).allowed


# --- settling ---


@ALGORITHM
async def test_a_refund_gives_back_what_the_call_did_not_use(
    make_backend: BackendFactory, clock: FakeClock, algorithm: str
) -> None:
    rl = limiter(make_backend, clock, algorithm)
    decision = await limit_for(rl).decide(cost={"tokens": 50})
    assert await limit_for(rl).settle(decision, {"tokens": 10}) is True
    after = await limit_for(rl).peek(cost={"tokens": 1})
    assert left(after) == [("api:3/m", 1), ("api:100 tokens/m", 89)]


@ALGORITHM
async def test_an_excess_is_recorded_past_the_limit_and_waited_out(
    make_backend: BackendFactory, clock: FakeClock, algorithm: str
) -> None:
    rl = limiter(make_backend, clock, algorithm)
    decision = await limit_for(rl).decide(cost={"tokens": 20})
    assert await limit_for(rl).settle(decision, {"tokens": 250})
    refused = await limit_for(rl).decide(cost={"tokens": 1})
    assert not refused.allowed
    assert str(refused.rule) == "api:100 tokens/m"
    if algorithm != "fixed-window":  # which forgets it when its window ends
        assert refused.retry_after > 50  # 250 tokens of 100 a minute: a minute or so to wait
    clock.advance(refused.retry_after + 0.001)
    assert (await limit_for(rl).decide(cost={"tokens": 1})).allowed


@ALGORITHM
async def test_settling_twice_or_a_peek_raises_and_a_refusal_is_a_no_op(
    make_backend: BackendFactory, clock: FakeClock, algorithm: str
) -> None:
    rl = limiter(make_backend, clock, algorithm)
    decision = await limit_for(rl).decide(cost={"tokens": 100})
    assert await limit_for(rl).settle(decision, {"tokens": 100})
    with pytest.raises(SettleError, match="settled already"):
        await limit_for(rl).settle(decision, {"tokens": 1})
    refused = await limit_for(rl).decide(cost={"tokens": 1})
    assert not refused.allowed
    assert await limit_for(rl).settle(refused, {"tokens": 0}) is False
    other = rl.limit(REQUESTS_AND_TOKENS, key="llm", api="other")
    peeked = await other.peek(cost={"tokens": 1})
    assert peeked.allowed
    with pytest.raises(SettleError, match="peek"):
        await other.settle(peeked, {"tokens": 1})


async def test_a_bad_settled_cost_raises_and_leaves_the_decision_to_settle() -> None:
    rl = RateLimit(MemoryBackend())
    limit = rl.limit("5/m", key="bad")
    decision = await limit.decide(cost=3)
    with pytest.raises(ConfigurationError, match="whole number of hits, 0 or more"):
        await limit.settle(decision, 1.5)
    with pytest.raises(ConfigurationError, match="whole number of hits, 0 or more"):
        await limit.settle(decision, -1)
    assert await limit.settle(decision, 0)
    assert (await limit.peek(cost=5)).allowed


@ALGORITHM
async def test_settle_runs_after_the_body_with_its_result(
    make_backend: BackendFactory, clock: FakeClock, algorithm: str
) -> None:
    rl = limiter(make_backend, clock, algorithm)

    @rl.limit(
        "api:100 tokens/m",
        cost=lambda api, max_tokens: {"tokens": max_tokens},
        settle=lambda used: {"tokens": used},
    )
    async def complete(api: str, max_tokens: int) -> int:
        return max_tokens // 4

    for _ in range(5):  # each reserves 40, uses 10: without settling, the third is refused
        assert await complete("k", 40) == 10
    with pytest.raises(RateLimitExceeded):
        await complete("k", 51)  # 50 used


async def test_an_async_settle_is_awaited_and_a_raising_body_keeps_its_reservation() -> None:
    rl = RateLimit(MemoryBackend())

    async def used(result: int) -> int:
        await asyncio.sleep(0)
        return result

    @rl.limit("10/m", key="job", cost=lambda n: 5, settle=used)
    async def job(n: int) -> int:
        if n < 0:
            raise ValueError("failed")
        return n

    assert await job(1) == 1  # reserved 5, used 1
    with pytest.raises(ValueError, match="failed"):
        await job(-1)  # reserved 5, kept
    limit = rl.limit(key="job")
    assert (await limit.peek(cost=4)).allowed
    assert not (await limit.peek(cost=5)).allowed


def test_settle_needs_a_store_that_settles_and_no_background_counting() -> None:
    with pytest.raises(ConfigurationError, match="background=False"):
        RateLimit(MemoryBackend(), background=True).limit("5/s", settle=lambda r: 1)

    class NoSettle(MemoryBackend):
        settle = None  # type: ignore[assignment]

    with pytest.raises((ConfigurationError, TypeError)):
        RateLimit(NoSettle()).limit("5/s", settle=lambda r: 1)
    with pytest.raises(TypeError, match="settle must be a callable"):
        RateLimit(MemoryBackend()).limit("5/s", settle=3)  # type: ignore[call-overload]


async def test_a_refund_lifts_the_cached_refusals_of_its_key() -> None:
    rl = RateLimit(MemoryBackend(), denial_cache=100)
    limit = rl.limit("10/m", key="cached")
    decision = await limit.decide(cost=10)
    assert not (await limit.decide()).allowed  # remembered in the denial cache
    await limit.settle(decision, 2)
    assert (await limit.decide()).allowed


async def test_a_lost_settle_is_logged_once_and_raised_under_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Failing(MemoryBackend):
        async def settle(self, settlement: Any) -> None:
            raise BackendError("down")

    rl = RateLimit(Failing())
    limit = rl.limit("10/m", key="lost")
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        for _ in range(3):
            assert await limit.settle(await limit.decide(cost=5), 1) is False
    assert sum("settles lost" in r.getMessage() for r in caplog.records) == 1
    raising = RateLimit(Failing(), on_error="raise").limit("10/m", key="lost")
    with pytest.raises(BackendError):
        await raising.settle(await raising.decide(cost=5), 1)


async def test_the_door_settles_for_front_ends_of_one_s_own() -> None:
    rl = RateLimit(MemoryBackend())
    tree = compile_tree(to_tree(REQUESTS_AND_TOKENS))
    assert rl.check(tree, {"tokens": 30}) == (1, 30)
    decision = await rl.decide(tree, "door", ("k",), cost={"tokens": 30})
    assert await rl.settle(decision, {"tokens": 5})
    after = await rl.decide(tree, "door", ("k",), cost={"tokens": 1}, record=False)
    assert left(after) == [("api:3/m", 1), ("api:100 tokens/m", 94)]


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
async def test_a_one_rule_settlement_is_the_leaf_by_leaf_one(
    algorithm: str, clock: FakeClock
) -> None:
    """``settlement`` answers a plan of one rule without its loops: the same Settlement as
    ``by_leaf``'s, for refunds, excesses and the cost reserved, of reservations made on
    a bucket empty, part full and full, and of an arrival time where GCRA's push recorded
    less than the cost."""
    rl = RateLimit(MemoryBackend(clock=clock), "s1", algorithm=algorithm)
    limit = rl.limit("user:10/m", key="k", user="u")
    reservations = []
    for _ in range(8):
        decision = await limit.decide(cost=3)
        if decision._reservation is not None:
            reservations.append(list(decision._reservation))
        clock.advance(1.5)
    assert len(reservations) >= 3
    for plan, at_us, counts, *_ in reservations:
        ahead = [(at_us + 3_600_000_000, 0)]  # GCRA: past the burst, as an excess leaves it
        for actual in (0, 1, 2, 3, 4, 7):
            for parts in ((), (at_us - 1000,)):
                for read in (counts, ahead):
                    one = settlement(plan, at_us, read, actual, *([parts] if parts else []))
                    assert one == by_leaf(plan, at_us, read, actual, parts), (actual, parts)
    await rl.aclose()
