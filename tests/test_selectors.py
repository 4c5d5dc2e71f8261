"""Where selector values come from, in which order, and the error when they come from nowhere."""

from __future__ import annotations

import asyncio
import inspect
import sys
from typing import Any

import pytest

from ratelimit import RateLimit, RateLimitExceeded, SelectorNotFoundError
from ratelimit.backends.memory.backend import MemoryBackend
from ratelimit.core.selectors import CallSite, Parameters, SelectorSources, resolve, resolved_now


@pytest.fixture
def rl() -> RateLimit:
    return RateLimit(MemoryBackend(), "sel")


class API:
    """Selectors as an attribute, a method and an async method."""

    username = "attr-user"

    def apikey(self) -> str:
        return "method-key"

    async def ip(self) -> str:
        await asyncio.sleep(0)
        return "10.0.0.1"


async def two_then_denied(call: Any, *args: Any, **kwargs: Any) -> None:
    await call(*args, **kwargs)
    await call(*args, **kwargs)
    with pytest.raises(RateLimitExceeded):
        await call(*args, **kwargs)


async def test_keyword_literal_callable_and_async_callable(rl: RateLimit) -> None:
    async def get_ip() -> str:
        return "1.1.1.1"

    seen: list[str] = []

    @rl.limit("user:2/m & apikey:2/m & ip:2/m", user="u", apikey=lambda: "k", ip=get_ip)
    async def work() -> None:
        seen.append("ran")

    await two_then_denied(work)
    assert seen == ["ran", "ran"]


async def test_selector_object_attribute_method_and_async_method(rl: RateLimit) -> None:
    @rl.limit("username:2/m | apikey:5/m | ip:5/m", selector=API())
    async def work() -> None: ...

    await two_then_denied(work)


async def test_selector_mapping_items(rl: RateLimit) -> None:
    @rl.limit("username:2/m", selector={"username": "from-mapping"})
    async def work() -> None: ...

    await two_then_denied(work)


async def test_call_arguments_by_parameter_name(rl: RateLimit) -> None:
    @rl.limit("user:2/m")
    async def login(user: str, password: str) -> str:
        return user

    assert await login("alice", "pw") == "alice"
    assert await login(user="alice", password="pw") == "alice"
    with pytest.raises(RateLimitExceeded):
        await login("alice", password="pw")
    assert await login("bob", "pw") == "bob"


async def test_parameter_defaults_and_var_keyword(rl: RateLimit) -> None:
    @rl.limit("region:2/m")
    async def with_default(region: str = "eu") -> None: ...

    await two_then_denied(with_default)

    @rl.limit("tenant:2/m")
    async def with_kwargs(**options: str) -> None: ...

    await two_then_denied(with_kwargs, tenant="t1")


async def test_self_attributes_and_methods(rl: RateLimit) -> None:
    class MyAPI(API):
        def __init__(self, name: str) -> None:
            self.username = name

        @rl.limit("username:2/m | apikey:100/m | ip:100/m")
        async def do_stuff(self) -> str:
            return self.username

    vova, dima = MyAPI("vova"), MyAPI("dima")
    await two_then_denied(vova.do_stuff)
    assert await dima.do_stuff() == "dima"


async def test_concurrent_calls_keep_their_own_self(rl: RateLimit) -> None:
    # Seed 002 stored the call's arguments on the shared Limit, so concurrent calls
    # could be counted against another caller's self.
    class User:
        def __init__(self, name: str) -> None:
            self.name = name

        @rl.limit("name:1/m")
        async def act(self) -> str:
            await asyncio.sleep(0)
            return self.name

    users = [User(f"user{i}") for i in range(50)]
    results = await asyncio.gather(*(u.act() for u in users))
    assert results == [u.name for u in users]
    for u in users:  # each user spent exactly its own one call
        with pytest.raises(RateLimitExceeded):
            await u.act()


async def test_lookup_order(rl: RateLimit) -> None:
    class Holder:
        user = "from-self"

        @rl.limit("user:1/m", user="from-keyword", key="order-kw")
        async def by_keyword(self, user: str) -> None: ...

        @rl.limit("user:1/m", selector={"user": "from-object"}, key="order-obj")
        async def by_object(self, user: str) -> None: ...

        @rl.limit("user:1/m", key="order-arg")
        async def by_argument(self, user: str) -> None: ...

        @rl.limit("user:1/m", key="order-self")
        async def by_self(self) -> None: ...

    h = Holder()
    # Once "from-keyword" has its hit, any other argument value is still limited.
    await h.by_keyword("a")
    with pytest.raises(RateLimitExceeded):
        await h.by_keyword("b")
    await h.by_object("a")
    with pytest.raises(RateLimitExceeded):
        await h.by_object("b")
    await h.by_argument("a")
    await h.by_argument("b")  # the argument is used: a new value is a new counter
    with pytest.raises(RateLimitExceeded):
        await h.by_argument("a")
    await h.by_self()
    with pytest.raises(RateLimitExceeded):
        await h.by_self()


async def test_values_become_text_and_bytes_decode(rl: RateLimit) -> None:
    @rl.limit("user:1/m")
    async def work(user: object) -> None: ...

    await work(7)
    with pytest.raises(RateLimitExceeded):
        await work("7")
    await work(b"\xff\xfe")
    await work(b"\xff\xfd")  # undecodable bytes stay distinct
    with pytest.raises(RateLimitExceeded):
        await work(b"\xff\xfe")


async def test_missing_selector_names_the_selector_and_places(rl: RateLimit) -> None:
    @rl.limit("username:10/m", selector=API(), key="missing")
    async def work(user: str) -> None: ...

    with pytest.raises(SelectorNotFoundError) as caught:
        await rl.limit("apikey:1/m & token:1/m", apikey="k", key="missing2").decide()
    message = str(caught.value)
    assert caught.value.selector == "token"
    assert "'token'" in message
    assert "keyword arguments of limit() (apikey)" in message
    assert "async with" in message
    assert isinstance(caught.value, LookupError)

    @rl.limit("nickname:10/m", selector={"username": "u"})
    async def other(user: str) -> None: ...

    with pytest.raises(SelectorNotFoundError) as caught:
        await other("x")
    message = str(caught.value)
    assert "items of the selector object dict" in message
    assert "parameters of the call (user)" in message
    assert "attributes of the first argument (str)" in message


async def test_a_failing_selector_callable_propagates_and_records_nothing(
    rl: RateLimit,
) -> None:
    calls = 0

    def broken() -> str:
        raise KeyError("no session")

    @rl.limit("1/m & user:1/m", user=broken)
    async def work() -> None:
        nonlocal calls
        calls += 1

    with pytest.raises(KeyError, match="no session"):
        await work()
    assert calls == 0
    assert len(rl.storage) == 0  # type: ignore[arg-type]


def _pos_only(user: str = "default", other: str = "", /, **rest: object) -> None: ...


def _var_args(user: str = "default", *args: object, flag: bool = False) -> None: ...


def _kw_only(*, user: str, flag: bool = False) -> None: ...


def _plain(user: str, flag: bool = False, **rest: object) -> None: ...


CALLS: list[tuple[tuple[object, ...], dict[str, object]]] = [
    ((), {}),
    (("a",), {}),
    ((), {"user": "b"}),
    (("a", "x"), {"user": "c"}),
    ((), {"user": "b", "flag": True}),
    (("a", True, 3), {}),
]


def _bound_value(signature: inspect.Signature, args: Any, kwargs: Any, name: str) -> object:
    from ratelimit.core.selectors import _MISSING

    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    parameter = signature.parameters.get(name)
    if parameter is not None and parameter.kind not in (
        inspect.Parameter.VAR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    ):
        return bound.arguments[name]
    for p in signature.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return bound.arguments[p.name].get(name, _MISSING)
    return _MISSING


def test_parameter_lookup_agrees_with_signature_bind() -> None:
    from ratelimit.core.selectors import Parameters

    checked = 0
    for function in (_pos_only, _var_args, _kw_only, _plain):
        signature = inspect.signature(function)
        parameters = Parameters(signature)
        for args, kwargs in CALLS:
            try:
                signature.bind(*args, **kwargs)
            except TypeError:
                continue  # not a valid call of this function
            for name in ("user", "flag"):
                expected = _bound_value(signature, args, kwargs, name)
                assert parameters.lookup(name, args, kwargs) is expected, (function, args, kwargs)
                checked += 1
    # Python 3.13's bind also accepts a positional-only name passed by keyword into
    # **kwargs (``_pos_only(user="b")``), as the call does: four more cases, which agree
    assert checked == (30 if sys.version_info >= (3, 13) else 26)


async def test_the_quick_resolution_answers_as_resolve_or_leaves_it_to_it() -> None:
    """``resolved_now`` (no coroutine) takes only calls whose selectors are all arguments;
    where it answers, ``resolve`` answers the same, and it leaves every other case to it."""

    async def f(user: str, n: int = 3, *rest: object, tag: bytes = b"t", **more: object) -> None:
        return None

    parameters = Parameters(inspect.signature(f))
    names = ("user", "n", "tag")
    plain = SelectorSources()
    calls: list[tuple[tuple[object, ...], dict[str, Any]]] = [
        (("u",), {}),
        (("u", 7), {"tag": b"x"}),
        ((), {"user": None, "n": 1}),
    ]
    for args, kwargs in calls:
        call = CallSite(parameters, args, kwargs)
        quick = resolved_now(names, plain, call)
        assert quick is not None
        assert quick == await resolve(names, plain, "k", call)
    call = CallSite(parameters, ("u",), {})
    assert resolved_now(names, SelectorSources({"user": lambda: "kw"}), call) is None
    assert resolved_now(names, SelectorSources(obj=API()), call) is None
    assert resolved_now(names, plain, None) is None
    assert resolved_now(("username",), plain, call) is None  # missing: resolve raises
    with pytest.raises(SelectorNotFoundError):
        await resolve(("username",), plain, "k", call)
