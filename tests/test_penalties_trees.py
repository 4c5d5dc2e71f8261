"""What a penalty holds back does not depend on which rules decided the call: the value of
the penalty's selector (named, or inferred from the limit's rules as written), whatever
override or callable chose the rules. Every store, and the front ends that build calls:
``rl.limit`` (decorator and ``decide``), the ASGI ``Route``, ``rl.decide``."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

from ratelimit import ConfigurationError, MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.asgi import RateLimitMiddleware, Route
from ratelimit.core.plan import compile_tree
from ratelimit.rules.tree import to_tree
from tests.conftest import FakeClock, Maker

pytestmark = pytest.mark.timeout(60)

PENALTY = "ip: 2 refusals/10m for 1h"


async def test_refusals_under_an_override_that_names_no_selector_count(
    make_limiter: Maker,
) -> None:
    """``ip:3/m`` with an override of ``1/h`` for one ip: its refusals count for that ip,
    and hold it (not its neighbours)."""
    rl = make_limiter("sliding-window")
    bad = rl.limit("ip:3/m", key="api", ip="a", penalty=PENALTY)
    good = rl.limit("ip:3/m", key="api", ip="b", penalty=PENALTY)
    await rl.overrides.set("api", "1/h", ip="a")
    decisions = [await bad.decide() for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, False, False, False]
    assert decisions[1].penalty is None  # a refusal of the override's rule, counted
    assert decisions[2].penalty == pytest.approx(3600)  # the second: the hold starts
    assert decisions[3].penalty == pytest.approx(3600)  # held
    assert (await good.decide()).allowed


async def test_a_penalty_under_an_override_of_the_whole_key_holds_the_value(
    make_limiter: Maker,
) -> None:
    """An override of every call of the key (``5/m``, no selector) under a limit whose
    penalty holds back ``ip`` (inferred from ``ip:3/m``): one ip's refusals hold that ip,
    never the whole key."""
    rl = make_limiter("sliding-window")
    penalty = "2 refusals/10m for 1h"  # the selector inferred from the limit's rules
    bad = rl.limit("ip:3/m", key="api", ip="a", penalty=penalty)
    good = rl.limit("ip:3/m", key="api", ip="b", penalty=penalty)
    await rl.overrides.set("api", "5/m")
    assert [(await bad.decide()).allowed for _ in range(5)] == [True] * 5
    for _ in range(2):
        assert not (await bad.decide()).allowed  # the shared 5/m refuses: a's refusals
    assert (await bad.decide()).penalty == pytest.approx(3600)
    refused = await good.decide()  # the shared rule refuses b too, but b is not held
    assert not refused.allowed
    assert refused.penalty is None
    holds = await rl.penalties.list()
    assert [(h.key, h.selector, h.value) for h in holds] == [("api", "ip", "a")]


async def test_rl_decide_under_an_override_holds_the_value_of_the_limits_own_rules() -> None:
    """``rl.decide`` with an override's rules (``override=True``) and ``penalty_of``: the
    limit's own rules and values, from which the penalty reads its selector and value."""
    rl = RateLimit(MemoryBackend(clock=FakeClock()))
    own = compile_tree(to_tree("ip:3/m"))
    whole = compile_tree(to_tree("1/h"))  # an override of every call of the key
    penalty = "2 refusals/10m for 1h"
    for _ in range(3):
        decision = await rl.decide(
            whole, "api", (), override=True, penalty=penalty, penalty_of=(own, ("a",))
        )
    assert decision.penalty == pytest.approx(3600)  # a: one admitted, two refusals
    other = await rl.decide(
        whole, "api", (), override=True, penalty=penalty, penalty_of=(own, ("b",))
    )
    assert other.penalty is None  # b is refused by the override's rule, not held
    await rl.aclose()


def client(app: Any, peer: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 4000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def test_a_route_with_a_penalty_applies_an_override_of_its_key(clock: FakeClock) -> None:
    rl = RateLimit(MemoryBackend(clock=clock))

    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[StarletteRoute("/api", ok)])
    app.add_middleware(
        RateLimitMiddleware,
        limiter=rl,
        routes=[Route("/api", "ip:3/m", key="api", penalty="2 refusals/10m for 1h")],
    )
    await rl.overrides.set("api", "1/h", ip="198.51.100.7")
    async with client(app, "198.51.100.7") as bad, client(app, "198.51.100.8") as good:
        assert [(await bad.get("/api")).status_code for _ in range(3)] == [200, 429, 429]
        held = await bad.get("/api")
        assert held.status_code == 429
        assert int(held.headers["retry-after"]) > 3000  # the hold's time left
        assert (await good.get("/api")).status_code == 200
    await rl.aclose()


async def test_rules_chosen_per_call_hold_the_named_selectors_value() -> None:
    """A callable choosing rules per call, each naming ``apikey``: ``penalty="apikey: ..."``
    is accepted, and a hold of k1 never refuses k2."""
    rl = RateLimit(MemoryBackend(clock=FakeClock()))

    @rl.limit(lambda apikey: "apikey:2/m", key="chosen", penalty="apikey: 2 refusals/10m for 1h")
    async def search(apikey: str) -> str:
        return apikey

    assert [await search("k1"), await search("k1")] == ["k1", "k1"]
    for _ in range(2):
        with pytest.raises(RateLimitExceeded):
            await search("k1")
    with pytest.raises(RateLimitExceeded) as held:
        await search("k1")
    assert held.value.decision.penalty == pytest.approx(3600)
    assert await search("k2") == "k2"
    await rl.aclose()


def test_rules_chosen_by_a_callable_need_the_penalty_to_name_its_selector() -> None:
    rl = RateLimit(MemoryBackend())
    with pytest.raises(ConfigurationError, match="name the selector"):
        rl.limit(lambda apikey: "apikey:2/m", key="chosen2", penalty="2 refusals/10m for 1h")


async def test_a_penalty_selector_no_chosen_rules_or_source_give_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rules chosen by a function cannot be checked when the limit is made: a penalty whose
    selector neither the chosen rules nor any source gives (a misspelling) holds nobody,
    and says so once instead of quietly."""
    rl = RateLimit(MemoryBackend(clock=FakeClock()))

    @rl.limit(lambda apikey: "apikey:1/m", key="misspelt", penalty="user: 2 refusals/10m for 1h")
    async def search(apikey: str) -> str:
        return apikey

    with caplog.at_level(logging.WARNING, logger="ratelimit.penalties"):
        assert await search("x") == "x"
        for _ in range(3):
            with pytest.raises(RateLimitExceeded) as refused:
                await search("x")
            assert refused.value.decision.penalty is None  # never held
    warnings = [r.getMessage() for r in caplog.records if r.name == "ratelimit.penalties"]
    assert len(warnings) == 1, warnings
    assert "holds back 'user'" in warnings[0]
    assert await rl.penalties.list() == []
    await rl.aclose()
