"""A newcomer's first hour with the async limiter (issue 37): a plain ``def`` is refused when
decorated, blocks without ``key=`` count where they are made, and a selector that no call
can supply fails when decorating, with what was meant."""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

import ratelimit.sync
from ratelimit import (
    ConcurrencyLimitExceeded,
    MemoryBackend,
    RateLimit,
    RateLimitExceeded,
    SelectorNotFoundError,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def rl() -> AsyncIterator[RateLimit]:
    limiter = RateLimit(MemoryBackend(), "first-hour")
    yield limiter
    await limiter.aclose()


@pytest.fixture
def sync_rl() -> Iterator[ratelimit.sync.RateLimit]:
    limiter = ratelimit.sync.RateLimit.from_url("memory://", "first-hour")
    yield limiter
    limiter.close()


# --- 2. the async limiter on a plain def ---


def shout(word: str) -> str:
    return word.upper()


@pytest.mark.parametrize("what", ["limit", "concurrency"])
def test_a_plain_def_is_refused_when_decorated(rl: RateLimit, what: str) -> None:
    decorator = rl.limit("1/s") if what == "limit" else rl.concurrency("1")
    with pytest.raises(TypeError) as caught:
        decorator(shout)  # type: ignore[arg-type]
    message = str(caught.value)
    assert f"RateLimit.{what}() decorates coroutine functions" in message
    assert f"{__name__}.shout" in message
    assert "ratelimit.sync.RateLimit" in message
    assert "async def" in message


def test_a_lambda_and_a_plain_callable_object_are_refused(rl: RateLimit) -> None:
    class Plain:
        def __call__(self) -> int:
            return 1

    with pytest.raises(TypeError, match="ratelimit.sync.RateLimit"):
        rl.limit("1/s")(lambda: 1)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="ratelimit.sync.RateLimit"):
        rl.limit("1/s")(Plain())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ratelimit.sync.RateLimit"):
        rl.limit("1/s")(functools.partial(shout, "a"))  # type: ignore[arg-type]


async def test_what_gives_a_coroutine_is_accepted(rl: RateLimit) -> None:
    async def fetch(item: str) -> str:
        return item

    class Client:
        async def __call__(self, item: str) -> str:
            return item * 2

    limited = rl.limit("1/m", key="partial")(functools.partial(fetch, "a"))
    assert await limited() == "a"
    with pytest.raises(RateLimitExceeded):
        await limited()
    client = rl.limit("1/m", key="object")(Client())
    assert await client("b") == "bb"
    with pytest.raises(RateLimitExceeded):
        await client("b")
    slots = rl.concurrency("1", key="object-slots")(Client())
    assert await slots("c") == "cc"


async def test_a_function_marked_as_a_coroutine_function_is_accepted(rl: RateLimit) -> None:
    from asgiref.sync import markcoroutinefunction

    async def later() -> str:
        return "done"

    def start() -> Any:
        return later()

    marked = rl.limit("1/m", key="marked")(markcoroutinefunction(start))
    assert await marked() == "done"
    if sys.version_info >= (3, 12):
        again = inspect.markcoroutinefunction(start)  # type: ignore[attr-defined,unused-ignore]
        assert await rl.limit("1/m", key="marked-3.12")(again)() == "done"


def test_the_sync_limiter_refuses_what_gives_a_coroutine(
    sync_rl: ratelimit.sync.RateLimit,
) -> None:
    async def fetch() -> None: ...

    class Client:
        async def __call__(self) -> None: ...

    for func in (functools.partial(fetch), Client()):
        with pytest.raises(TypeError, match="use ratelimit.RateLimit for coroutines"):
            sync_rl.limit("1/s")(func)


# --- 3. async with without key= ---


async def test_an_unrelated_block_never_uses_up_another(rl: RateLimit) -> None:
    for _ in range(3):
        async with rl.limit("100/h"):
            pass
    async with rl.limit("3/m"):  # counted on its own: not the three hits above
        pass


async def test_a_block_made_inline_keeps_one_counter_across_calls(rl: RateLimit) -> None:
    async def search() -> str:
        async with rl.limit("2/m") as decision:
            return decision.key

    keys = {await search(), await search()}
    with pytest.raises(RateLimitExceeded):
        await search()
    line = search.__code__.co_firstlineno + 1
    assert keys == {f"{__name__}.{search.__qualname__}:{line}:20"}


async def test_one_limit_object_is_one_counter_and_two_on_a_line_count_apart(
    rl: RateLimit,
) -> None:
    shared = rl.limit("2/m")
    async with shared:
        pass
    async with shared:
        pass
    with pytest.raises(RateLimitExceeded):
        async with shared:
            pass
    hourly, minutely = rl.limit("1/h"), rl.limit("1/m")
    assert (await hourly.decide()).allowed
    assert (await minutely.decide()).allowed  # not the hourly's hit
    assert hourly._own_key() != minutely._own_key()


async def test_methods_count_under_the_place_and_reset_forgets_it(rl: RateLimit) -> None:
    limit = rl.limit("1/m")
    first = await limit.decide()
    assert first.allowed
    assert re.fullmatch(rf"{re.escape(__name__)}\.test_methods_\w+:\d+:\d+", first.key)
    assert not (await limit.peek()).allowed
    assert (await rl.limit("1/m", key="elsewhere").peek()).allowed
    await limit.reset()
    assert (await limit.acquire()).key == first.key


async def test_concurrency_blocks_count_where_they_are_made(rl: RateLimit) -> None:
    async with rl.concurrency("1"):
        async with rl.concurrency("1"):  # another place: not the slot held above
            pass
        slots = rl.concurrency("1", key="one")
        async with slots:
            with pytest.raises(ConcurrencyLimitExceeded):
                async with rl.concurrency("1", key="one"):
                    pass


def test_sync_blocks_count_where_they_are_made(sync_rl: ratelimit.sync.RateLimit) -> None:
    for _ in range(3):
        with sync_rl.limit("100/h"):
            pass
    with sync_rl.limit("1/m") as decision:
        assert decision.key.startswith(f"{__name__}.test_sync_blocks_count_where_they_are_made:")
    limit = sync_rl.limit("1/m")
    assert limit.decide().allowed
    assert not limit.decide().allowed
    with sync_rl.concurrency("1"), sync_rl.concurrency("1"):  # two places: two slots
        pass


def test_a_sync_limit_made_again_keeps_its_place(sync_rl: ratelimit.sync.RateLimit) -> None:
    limit = sync_rl.limit("1/m")
    key = limit.decide().key
    sync_rl.generation += 1  # as in a forked child: every limit is made again, elsewhere
    again = limit.peek()
    assert again.key == key
    assert not again.allowed


# --- 5. a selector that no call can supply ---


async def test_a_misspelt_selector_fails_when_decorating(rl: RateLimit) -> None:
    with pytest.raises(SelectorNotFoundError) as caught:

        @rl.limit("usr:3/m")
        async def login(user, password):  # type: ignore[no-untyped-def]
            ...

    error = caught.value
    assert error.selector == "usr"
    message = str(error)
    assert "selector 'usr' of rule 'usr:3/m'" in message
    assert ".login(user, password)" in message
    assert "did you mean 'user'?" in message


@pytest.mark.parametrize("what", ["async", "concurrency", "sync", "mapping"])
async def test_every_decorator_checks_its_selectors(
    rl: RateLimit, sync_rl: ratelimit.sync.RateLimit, what: str
) -> None:
    async def login(user: str) -> None: ...

    def plain(user: str) -> None: ...

    decorate: dict[str, Callable[[], object]] = {
        "async": lambda: rl.limit("usr:3/m | 10/s")(login),
        "concurrency": lambda: rl.concurrency("usr:2")(login),
        "sync": lambda: sync_rl.limit("usr:3/m")(plain),
        "mapping": lambda: rl.limit({"free": "user:3/m", "pro": "usr:30/m"}, tier="x")(login),
    }
    with pytest.raises(SelectorNotFoundError, match="did you mean 'user'"):
        decorate[what]()


async def test_no_close_name_says_how_to_give_it(rl: RateLimit) -> None:
    async def export() -> None: ...

    with pytest.raises(SelectorNotFoundError, match=r"pass apikey= to limit\(\)"):
        rl.limit("apikey:3/m")(export)
    with pytest.raises(SelectorNotFoundError, match=r"pass apikey= to concurrency\(\)"):
        rl.concurrency("apikey:3")(export)


async def test_what_a_call_might_supply_is_left_to_the_call(rl: RateLimit) -> None:
    class Request:
        user = "ann"

    class Account:
        def __init__(self) -> None:
            self.user = "bob"

        @rl.limit("user:1/m", key="method")
        async def act(self) -> str:
            return self.user

    @rl.limit("user:1/m", key="keywords")
    async def by_keywords(**options: Any) -> Any:
        return options["user"]

    @rl.limit("user:1/m", key="object-first")
    async def handle(request: Request) -> str:
        return request.user

    @rl.limit("user:1/m", key="unannotated-first")  # no misspelling: its attributes may
    async def view(request):  # type: ignore[no-untyped-def]
        return request.user

    @rl.limit("user:1/m", key="given", user=lambda: "cy")
    async def given() -> None: ...

    @rl.limit("user:1/m", key="selector-object", selector={"user": "dee"})
    async def selected() -> None: ...

    @rl.limit(lambda: "user:1/m", key="chosen")
    async def chosen() -> None: ...

    @rl.limit(key="method")  # the rules of "method", known at the first call
    async def again() -> None: ...

    assert await Account().act() == "bob"
    assert await by_keywords(user="eve") == "eve"
    assert await handle(Request()) == "ann"
    assert await view(Request()) == "ann"
    with pytest.raises(SelectorNotFoundError):  # found nowhere: at the call, as before
        await chosen()
