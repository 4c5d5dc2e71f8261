"""The front end: decorators, ``async with``, keys and their registry, construction, errors."""

from __future__ import annotations

import inspect
import types
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import assert_type

import pytest

import ratelimit
from ratelimit import (
    And,
    ConfigurationError,
    Decision,
    MemoryBackend,
    RateLimit,
    RateLimitError,
    RateLimitExceeded,
    RedisScriptBackend,
    Rule,
    RuleConflictError,
    RuleSyntaxError,
    UnknownKeyError,
)


@pytest.fixture
def rl() -> RateLimit:
    return RateLimit(MemoryBackend(), "front")


def test_public_names_are_sorted_and_complete() -> None:
    assert ratelimit.__all__ == sorted(ratelimit.__all__)
    # every public name but the package's own modules (bound once imported, by any test)
    public = {
        name
        for name, value in vars(ratelimit).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(ratelimit.__all__)


def test_exception_tree() -> None:
    for exc in (
        RateLimitExceeded,
        RuleSyntaxError,
        RuleConflictError,
        UnknownKeyError,
        ratelimit.SelectorNotFoundError,
        ratelimit.BackendError,
    ):
        assert issubclass(exc, RateLimitError)
    assert issubclass(RateLimitExceeded, RuntimeError)
    assert issubclass(RuleSyntaxError, ValueError)


async def test_async_def_keeps_name_signature_and_result(rl: RateLimit) -> None:
    @rl.limit("5/s")
    async def fetch(item: int, *, verbose: bool = False) -> str:
        """Fetch one item."""
        return f"{item}{verbose}"

    assert fetch.__name__ == "fetch"
    assert fetch.__doc__ == "Fetch one item."
    assert str(inspect.signature(fetch)) == "(item: 'int', *, verbose: 'bool' = False) -> 'str'"
    assert inspect.iscoroutinefunction(fetch)
    assert await fetch(1, verbose=True) == "1True"


def test_typing_keeps_the_signature(rl: RateLimit) -> None:
    @rl.limit("5/s")
    async def fetch(item: int) -> str:
        return str(item)

    fetched = fetch(1)
    _ = assert_type(fetched, Coroutine[object, None, str])
    fetched.close()

    @rl.limit("5/s", key="stacked-a")
    @rl.limit("10/m", key="stacked-b")
    async def stacked(item: int) -> str:  # stacked limits keep the types too
        return str(item)

    twice = stacked(1)
    _ = assert_type(twice, Coroutine[object, None, str])
    twice.close()
    assert inspect.signature(fetch).parameters.keys() == {"item"}


async def test_exception_carries_retry_after_rule_key_and_decision(rl: RateLimit) -> None:
    @rl.limit("user:1/m", key="profile")
    async def profile(user: str) -> None: ...

    await profile("u")
    with pytest.raises(RateLimitExceeded) as caught:
        await profile("u")
    exc = caught.value
    assert exc.key == "profile"
    assert exc.rule == Rule(1, 60_000, "user")
    assert 59 < exc.retry_after <= 60
    assert exc.decision.allowed is False
    assert "'profile'" in str(exc)
    assert "user:1/m" in str(exc)
    assert "retry after" in str(exc)


async def test_bad_rules_fail_when_decorating_not_when_calling(rl: RateLimit) -> None:
    with pytest.raises(RuleSyntaxError, match="column 4"):

        @rl.limit("10/x")
        async def never() -> None: ...


def test_generators_and_non_callables_are_refused(rl: RateLimit) -> None:
    async def agen() -> AsyncIterator[int]:
        yield 1

    def gen() -> Iterator[int]:
        yield 1

    with pytest.raises(
        TypeError, match="cannot decorate generator function .*agen: the limit would count"
    ):
        rl.limit("1/s")(agen)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot decorate generator function .*gen"):
        rl.limit("1/s")(gen)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="decorates functions, not int"):
        rl.limit("1/s")(5)  # type: ignore[arg-type]


def test_limit_needs_rules_or_key(rl: RateLimit) -> None:
    with pytest.raises(TypeError, match="needs rules, or key="):
        rl.limit()
    with pytest.raises(TypeError, match="key must be text"):
        rl.limit("1/s", key=5)  # type: ignore[call-overload]


async def test_key_shares_counters_and_reuse_inherits_rules_and_selectors(
    rl: RateLimit,
) -> None:
    class API:
        username = "kitten"
        apikey = "k1"

    @rl.limit(And("username:2/m", "apikey:2/m"), selector=API(), key="cats")
    async def good_kittie() -> str:
        return "good"

    @rl.limit(key="cats")
    async def bad_kittie() -> str:
        return "bad"

    assert await good_kittie() == "good"
    assert await bad_kittie() == "bad"  # selectors came from "cats" (seed 002 lost them)
    with pytest.raises(RateLimitExceeded) as caught:
        await good_kittie()
    assert caught.value.key == "cats"


async def test_reuse_with_own_selector_overrides_registered_ones(rl: RateLimit) -> None:
    @rl.limit("username:1/m", username="alice", key="dogs")
    async def alice() -> None: ...

    @rl.limit(key="dogs", username="bob")
    async def bob() -> None: ...

    await alice()
    await bob()
    with pytest.raises(RateLimitExceeded):
        await bob()


async def test_reuse_is_resolved_at_first_call_so_import_order_does_not_matter(
    rl: RateLimit,
) -> None:
    @rl.limit(key="late")
    async def early() -> None: ...

    @rl.limit("1/m", key="late")
    async def registered_later() -> None: ...

    await early()
    with pytest.raises(RateLimitExceeded):
        await registered_later()


async def test_unknown_key_raises_at_first_call(rl: RateLimit) -> None:
    @rl.limit(key="nobody")
    async def orphan() -> None: ...

    with pytest.raises(UnknownKeyError, match="no rules are registered for key 'nobody'"):
        await orphan()


def test_different_rules_under_one_key_are_refused(rl: RateLimit) -> None:
    @rl.limit("10/s", key="api")
    async def a() -> None: ...

    @rl.limit("10/s", key="api")  # the same rules again: fine
    async def b() -> None: ...

    with pytest.raises(RuleConflictError, match="key 'api' already has rules '10/s'"):

        @rl.limit("20/s", key="api")
        async def c() -> None: ...


def test_stacked_limits_on_one_function_need_their_own_keys(rl: RateLimit) -> None:
    # Both would count on the same default key and double-count each call.
    with pytest.raises(RuleConflictError, match="give this limit its own key="):

        @rl.limit("10/s")
        @rl.limit("100/h")
        async def f() -> None: ...

    @rl.limit("10/s", key="f-per-second")
    @rl.limit("100/h", key="f-per-hour")
    async def g() -> None: ...


async def test_default_key_is_module_and_qualname(rl: RateLimit) -> None:
    @rl.limit("1/m")
    async def here() -> None: ...

    await here()
    with pytest.raises(RateLimitExceeded) as caught:
        await here()
    assert caught.value.key == f"{__name__}.{here.__qualname__}"


async def test_context_managers_without_key_count_where_they_are_made(rl: RateLimit) -> None:
    async def login() -> Decision:
        async with rl.limit("user:2/m", user="vova") as decision:
            return decision

    first = await login()
    assert isinstance(first, Decision)
    line = login.__code__.co_firstlineno + 1
    assert first.key == f"{__name__}.{login.__qualname__}:{line}:20"  # column of rl.limit
    await login()  # the same place, made again: one counter
    with pytest.raises(RateLimitExceeded):
        await login()
    async with rl.limit("user:2/m", user="vova"):  # another place: counters of its own
        pass
    async with rl.limit("user:2/m", user="vova", key="login"):
        pass
    # a place is exempt from the one-rule-set check: one line may make other rules each time
    for rules in ("user:5/h", "user:6/h"):
        async with rl.limit(rules, user="dima"):
            pass


async def test_exceptions_in_the_body_propagate_and_the_hit_stays(rl: RateLimit) -> None:
    with pytest.raises(ZeroDivisionError):
        async with rl.limit("1/m", key="body"):
            _ = 1 / 0
    assert not (await rl.limit("1/m", key="body").decide()).allowed


async def test_decide_never_raises_for_a_denial(rl: RateLimit) -> None:
    limit = rl.limit("1/m", key="quiet")
    assert (await limit.decide()).allowed
    denied = await limit.decide()
    assert not denied.allowed
    assert denied.retry_after > 0


async def test_rule_lists_mean_or(rl: RateLimit) -> None:
    @rl.limit(["2/m", "1/m"])
    async def f() -> None: ...

    await f()
    with pytest.raises(RateLimitExceeded):
        await f()


async def test_from_url_and_closing() -> None:
    async with RateLimit.from_url("memory://", namespace="x") as rl:
        assert isinstance(rl.storage, MemoryBackend)
        assert rl.namespace == "x"
        assert (await rl.limit("1/s", key="a").decide()).allowed
    redis_rl = RateLimit.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    assert isinstance(redis_rl.storage, RedisScriptBackend)
    await redis_rl.aclose()
    for url in ("rediss://localhost:6380/0", "unix:///tmp/redis.sock"):
        other = RateLimit.from_url(url)
        assert isinstance(other.storage, RedisScriptBackend)
        await other.aclose()


def test_bad_construction_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported storage URL 'mysql://x'"):
        RateLimit.from_url("mysql://x")
    with pytest.raises(TypeError, match="memory:// takes no options"):
        RateLimit.from_url("memory://", decode_responses=True)
    with pytest.raises(TypeError, match="needs a redis.asyncio.Redis"):
        RateLimit(object())
    with pytest.raises(TypeError, match="namespace must be text"):
        RateLimit(MemoryBackend(), 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clock= goes to the backend"):
        RateLimit(MemoryBackend(), clock=lambda: 0.0)


def test_a_synchronous_redis_client_is_refused() -> None:
    import redis

    with pytest.raises(TypeError, match="synchronous redis.Redis will not do"):
        RateLimit(redis.Redis())


@pytest.mark.parametrize("cost", [0, -1, 1.5])
def test_a_cost_must_be_a_positive_whole_number(rl: RateLimit, cost: object) -> None:
    with pytest.raises(ConfigurationError, match="cost must be a whole number of hits"):
        rl.limit("10/s", cost=cost)  # type: ignore[call-overload]


@pytest.mark.parametrize("cost", [True, "2", None])
def test_a_cost_must_be_a_number_a_mapping_or_a_callable(rl: RateLimit, cost: object) -> None:
    with pytest.raises(ConfigurationError, match="cost must be a number, a mapping from units"):
        rl.limit("10/s", cost=cost)  # type: ignore[call-overload]


def test_a_cost_above_a_rules_count_fails_at_once(rl: RateLimit) -> None:
    with pytest.raises(ConfigurationError, match="cost 6 is above the count of rule '5/m'"):
        rl.limit("100/h & 5/m", cost=6)
    assert issubclass(ConfigurationError, ValueError)


async def test_a_cost_above_a_reused_keys_count_fails_at_the_first_call(rl: RateLimit) -> None:
    @rl.limit(key="small", cost=6)
    async def heavy() -> None: ...

    @rl.limit("5/m", key="small")
    async def light() -> None: ...

    with pytest.raises(ConfigurationError, match="cost 6 is above"):
        await heavy()


def test_the_fast_decision_constructor_builds_the_same_immutable_decision() -> None:
    import dataclasses

    from ratelimit.core.decision import make_decision

    rule = Rule(1, 1000)
    fast = make_decision(False, 0.5, rule, 0, "k")
    assert fast == Decision(False, 0.5, rule, 0, "k")
    assert repr(fast) == repr(Decision(False, 0.5, rule, 0, "k"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.allowed = True  # type: ignore[misc]
