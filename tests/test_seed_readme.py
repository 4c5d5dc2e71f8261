"""Seed 002's README examples, translated to asyncio, behave as that README promises.

The seed decorated plain ``def``s; ``ratelimit.RateLimit`` takes coroutine functions (plain
functions are ``ratelimit.sync``'s), so each is an ``async def`` here."""

from __future__ import annotations

import pytest

from ratelimit import And, Or, RateLimit, RateLimitExceeded, RuleSyntaxError
from tests.conftest import FakeClock


def get_api_key() -> str:
    return "key-1"


def get_username() -> str:
    return "vova666"


class API:
    def apikey(self) -> str:
        return "key-2"

    def username(self) -> str:
        return "dima"


async def calls_admitted(func: object, n: int) -> int:
    assert callable(func)
    admitted = 0
    for _ in range(n):
        try:
            await func()
            admitted += 1
        except RateLimitExceeded:
            pass
    return admitted


async def test_ten_per_second(rl: RateLimit, clock: FakeClock) -> None:
    @rl.limit("10/s")
    async def do_stuff() -> None:
        """do_stuff() will only run 10 times per second, then an exception will be thrown"""

    assert await calls_admitted(do_stuff, 15) == 10
    clock.advance(1)
    assert await calls_admitted(do_stuff, 1) == 1


async def test_or_ten_per_second_or_fifteen_per_minute(rl: RateLimit, clock: FakeClock) -> None:
    @rl.limit(Or("10/s", "15/m"))
    async def do_stuff() -> None:
        """10 times per second, or 15 times per minute, whatever happens first"""

    assert await calls_admitted(do_stuff, 12) == 10
    clock.advance(1)
    assert await calls_admitted(do_stuff, 12) == 5


async def test_the_nested_example_without_the_unsupported_third_field(
    rl: RateLimit, clock: FakeClock
) -> None:
    # The README wrote 'apikey:5/s:0.1'; seed 002's own regex rejected that third field.
    with pytest.raises(RuleSyntaxError, match="third field"):
        And("apikey:100/h", Or("10/s", And("15/m", "apikey:5/s:0.1")))

    @rl.limit(And("apikey:100/h", Or("10/s", And("15/m", "apikey:5/s"))), apikey=get_api_key)
    async def do_stuff() -> None:
        """only start limiting when the apikey limit of 100 requests an hour is reached"""

    # Until the apikey has 100 hits in the hour, nothing limits.
    for _ in range(10):
        assert await calls_admitted(do_stuff, 10) == 10
        clock.advance(1)
    # Now 100/h holds, so the Or decides: 10/s is free in this new second, and
    # 15/m & apikey:5/s limits only once apikey:5/s is reached too: five more calls.
    assert await calls_admitted(do_stuff, 10) == 5
    clock.advance(0.5)
    assert await calls_admitted(do_stuff, 10) == 0


async def test_username_selector_function(rl: RateLimit) -> None:
    @rl.limit("username:10/5m", username=get_username)
    async def do_stuff() -> None:
        """each user can run do_stuff() 10 times in 5 minutes"""

    assert await calls_admitted(do_stuff, 12) == 10


async def test_and_of_two_selectors(rl: RateLimit) -> None:
    @rl.limit(And("username:10/5m", "apikey:100/m"), username=get_username, apikey=get_api_key)
    async def do_stuff() -> None:
        """throws when user reached 10 per 5 minutes AND his API key 100 per minute"""

    assert await calls_admitted(do_stuff, 120) == 100


async def test_selector_object(rl: RateLimit) -> None:
    @rl.limit(And("username:10/5m", "apikey:100/m"), selector=API())
    async def do_stuff() -> None:
        """the same as before, but prettier"""

    assert await calls_admitted(do_stuff, 120) == 100


async def test_bound_instance(rl: RateLimit) -> None:
    class MyAPI(API):
        @rl.limit(And("username:10/5m", "apikey:100/m"))
        async def do_stuff(self) -> None:
            """the decorator will look for username and apikey in 'self'"""

    assert await calls_admitted(MyAPI().do_stuff, 120) == 100


async def test_kitties_share_counters_and_selectors(rl: RateLimit) -> None:
    @rl.limit(And("username:10/5m", "apikey:100/m"), selector=API(), key="cats")
    async def good_kittie() -> None: ...

    @rl.limit(key="cats")
    async def bad_kittie() -> None: ...

    assert await calls_admitted(good_kittie, 60) == 60
    assert await calls_admitted(bad_kittie, 60) == 40


async def test_context_managers(rl: RateLimit) -> None:
    async def block() -> None:
        async with rl.limit("username:10/5m", username=get_username):
            pass

    for _ in range(10):
        await block()
    with pytest.raises(RateLimitExceeded):
        await block()
    # the seed's blocks without key= shared one global key; here each place counts on its
    # own, as a decorated function does
    async with rl.limit("username:10/5m", username=get_username):
        pass
    # with a key, the block has counters of its own
    async with rl.limit("username:10/5m", username=get_username, key="login"):
        pass
