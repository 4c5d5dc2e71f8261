"""Issue 37's checks when decorating, red-teamed: what worked at the call before them is
not refused when decorated (a request's attribute beside a parameter of a like name, an
async def behind a ``staticmethod`` or a ``functools.wraps`` wrapper)."""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import pytest

import ratelimit.sync
from ratelimit import MemoryBackend, RateLimit, SelectorNotFoundError

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def rl() -> AsyncIterator[RateLimit]:
    limiter = RateLimit(MemoryBackend(), "first-hour-redteam")
    yield limiter
    await limiter.aclose()


@pytest.fixture
def sync_rl() -> Iterator[ratelimit.sync.RateLimit]:
    limiter = ratelimit.sync.RateLimit.from_url("memory://", "first-hour-redteam")
    yield limiter
    limiter.close()


class Request:
    user = "ann"
    ip = "192.0.2.1"


async def test_a_request_attribute_named_like_a_parameter_is_left_to_the_call(
    rl: RateLimit,
) -> None:
    @rl.limit("user:1/m", key="user-id")
    async def profile(request, user_id):  # type: ignore[no-untyped-def]
        return request.user

    @rl.limit("user:1/m", key="username")
    async def page(request, username):  # type: ignore[no-untyped-def]
        return request.user

    @rl.limit("ip:1/m", key="zip")
    async def shipping(request, zip):  # type: ignore[no-untyped-def]
        return request.ip

    @rl.limit("user:1/m", key="renamed-self")
    async def act(this, user_id):  # type: ignore[no-untyped-def]
        return this.user

    assert await profile(Request(), 5) == "ann"
    assert await page(Request(), "bob") == "ann"
    assert await shipping(Request(), "12345") == "192.0.2.1"
    assert await act(Request(), 5) == "ann"
    with pytest.raises(ratelimit.RateLimitExceeded):  # it counts by request.user
        await profile(Request(), 6)


def test_a_misspelling_of_the_first_parameter_still_fails_when_decorating(
    rl: RateLimit, sync_rl: ratelimit.sync.RateLimit
) -> None:
    async def login(user, password):  # type: ignore[no-untyped-def]
        ...

    def plain(user, password):  # type: ignore[no-untyped-def]
        ...

    with pytest.raises(SelectorNotFoundError, match="did you mean 'user'"):
        rl.limit("usr:3/m")(login)
    with pytest.raises(SelectorNotFoundError, match="did you mean 'user'"):
        sync_rl.limit("usr:3/m")(plain)


async def fetch(n: int = 1) -> int:
    return n


def passing_on(func: Callable[..., Coroutine[Any, Any, int]]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:  # a plain def handing on the coroutine
        return func(*args, **kwargs)

    return wrapper


async def test_an_async_def_behind_a_staticmethod_or_a_wrapper_is_accepted(
    rl: RateLimit,
) -> None:
    class Client:
        @staticmethod
        async def get() -> str:
            return "got"

    static = Client.__dict__["get"]
    assert await rl.limit("1/m", key="static")(static)() == "got"
    assert await rl.concurrency("1", key="static-slots")(static)() == "got"
    assert await rl.limit("1/m", key="wrapped")(passing_on(fetch))(3) == 3

    def plain() -> int:
        return 1

    with pytest.raises(TypeError, match="use ratelimit.sync.RateLimit"):
        rl.limit("1/m", key="plain-wrapped")(functools.wraps(plain)(lambda: 1))  # type: ignore[arg-type]


def test_the_sync_limiter_refuses_an_async_def_behind_a_staticmethod(
    sync_rl: ratelimit.sync.RateLimit,
) -> None:
    class Client:
        @staticmethod
        async def get() -> None: ...

        @staticmethod
        def plain() -> str:
            return "plain"

    with pytest.raises(TypeError, match="use ratelimit.RateLimit for coroutines"):
        sync_rl.limit("1/s", key="static-async")(Client.__dict__["get"])
    assert sync_rl.limit("1/s", key="static-plain")(Client.__dict__["plain"])() == "plain"


# --- blocks typed in: a REPL, a notebook, exec (every statement on line 1) ---


async def _typed_in(
    rl: RateLimit, source: str, filename: str = "<stdin>", times: int = 1
) -> list[str]:
    """``source`` (``lim = rl.limit(...)``) run as a REPL or notebook runs a statement: the
    keys of ``times`` decisions of the limit it makes."""
    namespace: dict[str, Any] = {"rl": rl, "__name__": "__main__"}
    keys = []
    for _ in range(times):
        exec(compile(source, filename, "single"), namespace)
        keys.append((await namespace["lim"].acquire()).key)
    return keys


async def test_two_statements_typed_in_count_apart(rl: RateLimit) -> None:
    hourly = await _typed_in(rl, "lim = rl.limit('100/h')", times=3)
    minutely = await _typed_in(rl, "lim = rl.limit('3/m')")  # not the three hits above
    assert len(set(hourly)) == 1
    assert hourly[0] != minutely[0]
    assert hourly[0].startswith("__main__:1:7:")
    cells = [  # a notebook: its cells' files are real, its __main__ has no __file__
        await _typed_in(rl, f"lim = rl.limit('{rules}')", f"/tmp/ipykernel_1/{n}.py")
        for n, rules in enumerate(["100/h", "2/m"])
    ]
    assert cells[0] != cells[1]


async def test_a_statement_typed_again_counts_on(rl: RateLimit) -> None:
    await _typed_in(rl, "lim = rl.limit('2/m')", times=2)
    with pytest.raises(ratelimit.RateLimitExceeded):  # the same cell run again
        await _typed_in(rl, "lim = rl.limit('2/m')")


async def test_a_block_in_a_comprehension_has_the_key_of_every_python(rl: RateLimit) -> None:
    async def search() -> list[str]:
        return [(await limit.acquire()).key for limit in [rl.limit("5/m") for _ in "ab"]]

    line = search.__code__.co_firstlineno + 1
    place = f"{__name__}.{search.__qualname__}:{line}"
    keys = await search()
    assert keys[0] == keys[1]
    assert re.fullmatch(rf"{re.escape(place)}:\d+", keys[0])  # no <listcomp> (as 3.12+)


# --- header names: one answer, asked before or after iterating ---


def test_a_header_name_reads_alike_before_and_after_iterating() -> None:
    from ratelimit.asgi.header_map import HeaderMap

    raw = [(b"X-\xc4", b"latin"), (b"k", b"plain"), (b"X-API-Key", b"k1")]
    asked = ["X-\xc4", "x-\xe4", "\u212a", "x-api-KEY", "X-\u043a\u043b\u044e\u0447"]
    fresh = HeaderMap(raw)
    before = [(fresh.get(name), name in fresh) for name in asked]
    iterated = HeaderMap(raw)
    names = list(iterated)
    after = [(iterated.get(name), name in iterated) for name in asked]
    assert before == after
    assert before == [("latin", True), (None, False), (None, False), ("k1", True), (None, False)]
    assert names == ["x-\xc4", "k", "x-api-key"]  # HTTP folds ASCII letters only


async def test_limits_made_at_one_place_count_together_unless_keyed(rl: RateLimit) -> None:
    # what docs/rules.md says of a loop or a helper making limits for its callers
    def helper(rules: str, key: str | None = None) -> ratelimit.Limit:
        return rl.limit(rules, key=key)

    shared = {tenant: helper("2/m") for tenant in ("a", "b")}
    assert (await shared["a"].decide()).allowed
    assert (await shared["a"].decide()).allowed
    assert not (await shared["b"].decide()).allowed  # the helper's place: one counter
    keyed = {tenant: helper("2/m", key=f"export:{tenant}") for tenant in ("a", "b")}
    assert (await keyed["a"].decide()).allowed
    assert (await keyed["a"].decide()).allowed
    assert (await keyed["b"].decide()).allowed
