"""Issues 38 and 47: every front end keeps one layout per identifier. Where an identifier's
keys live is a property of the identifier (issue 47), so every front end decides its rules
as written (rules chosen per call, tiers, overrides, routes sharing a key), never pinned
for the sake of the layout; only the service's trees are compiled pinned (its domains keep
one slot each), and nothing warns of an override that mixes selectors."""

from __future__ import annotations

import logging
from pathlib import Path

import fakeredis
import pytest

from ratelimit import ConcurrencyLimitExceeded, MemoryBackend, RateLimit
from ratelimit.core.decision import Decision
from ratelimit.core.plan import CompiledTree, Plan
from ratelimit.front.chosen import ChosenRules


class Recording(MemoryBackend):
    """A memory backend that remembers the compiled tree of every plan it decides."""

    def __init__(self) -> None:
        super().__init__()
        self.trees: list[CompiledTree] = []

    async def decide(self, plan: Plan) -> Decision:
        self.trees.append(plan.compiled)
        return await super().decide(plan)

    def admit(self, plan: Plan) -> Decision | None:
        self.trees.append(plan.compiled)
        return super().admit(plan)


async def test_rules_chosen_by_a_callable_are_decided_as_written() -> None:
    backend = Recording()
    rl = RateLimit(backend)

    @rl.limit(lambda user: "user:5/m", key="chosen")
    async def work(user: str) -> None: ...

    await work("alice")
    (tree,) = backend.trees
    assert str(tree.tree) == "user:5/m"
    assert tree.spreads
    assert not tree.pinned


def test_a_mappings_entries_are_compiled_as_written() -> None:
    alike = ChosenRules({"free": "user:5/m", "pro": "user:50/m | user:500/h"}, {"tier": 1})
    assert all(c.spreads for c in alike.trees)
    mixed = ChosenRules({"free": "user:5/m", "pro": "ip:50/m"}, {"tier": 1})
    assert all(c.spreads for c in mixed.trees)
    assert not any(c.pinned for c in mixed.trees)
    partly = ChosenRules({"free": "user:5/m", "pro": "user:50/m & 100/m"}, {"tier": 1})
    assert [c.spreads for c in partly.trees] == [True, False]
    # equal mappings still compare equal (one registration per key)
    assert mixed == ChosenRules({"free": "user:5/m", "pro": "ip:50/m"}, {"tier": 1})


async def test_an_override_is_applied_as_written() -> None:
    backend = Recording()
    rl = RateLimit(backend)

    @rl.limit("user:5/m & 100/m", key="mixed")
    async def work(user: str) -> None: ...

    await rl.overrides.set("mixed", "user:1/m", user="alice")
    await work("alice")
    (tree,) = backend.trees
    assert str(tree.tree) == "user:1/m"
    assert tree.spreads  # alice's identifier is kept where every tree keeps it


async def test_an_override_mixing_selectors_under_a_spreading_limit_warns_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = Recording()
    rl = RateLimit(backend)

    @rl.limit("user:5/m", key="spreads")
    async def work(user: str, ip: str) -> None: ...

    await rl.overrides.set("spreads", "user:9/m & ip:9/m", user="alice")
    await rl.overrides.set("spreads", "user:7/m", user="bob")
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        for _ in range(3):
            await work("alice", "1.2.3.4")
        await work("bob", "1.2.3.4")
    assert [t.spreads for t in backend.trees] == [False, False, False, True]
    assert not [r for r in caplog.records if "mixes selectors" in r.getMessage()]


async def test_an_http_routes_override_is_applied_as_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("starlette")
    from ratelimit.asgi import Route, header
    from tests.test_asgi import app_with, client

    backend = Recording()
    rl = RateLimit(backend)
    routes = [
        Route("/a", "api:5/m & 100/m", key="pinned", api=header("x-api-key")),
        Route("/b", "api:5/m", key="spread", api=header("x-api-key")),
    ]
    await rl.overrides.set("pinned", "api:50/m", api="k")
    await rl.overrides.set("spread", "api:50/m & ip:50/m", api="k")
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        async with client(app_with(rl, routes)) as http:
            await http.get("/a", headers={"x-api-key": "k"})
            await http.get("/b", headers={"x-api-key": "k"})
            await http.get("/b", headers={"x-api-key": "k"})
    assert [str(t.tree) for t in backend.trees] == ["api:50/m", *["api:50/m & ip:50/m"] * 2]
    assert [t.spreads for t in backend.trees] == [True, False, False]
    assert not [r for r in caplog.records if "mixes selectors" in r.getMessage()]


RULES = """\
[[limit]]
domain = "envoy"
descriptor = ["remote_address"]
rule = "3/m"

[[limit]]
domain = "envoy"
descriptor = ["client_id"]
rule = "5/m"
"""


async def test_the_service_decides_every_tree_pinned(tmp_path: Path) -> None:
    pytest.importorskip("grpc")
    from ratelimit.service import rules_file
    from ratelimit.service.handlers import Handlers, ratio_tree
    from ratelimit.service.proto import ratio_pb2
    from ratelimit.service.proto.envoy import rls_pb2

    path = tmp_path / "rules.toml"
    path.write_text(RULES)
    backend = Recording()
    rl = RateLimit(backend, denial_cache=0)
    handlers = Handlers(rl, ratio_tree("owner:10/m"), rules_file.load(path), 5.0)
    one = rls_pb2.RateLimitRequest(domain="envoy")
    one.descriptors.add().entries.add(key="remote_address", value="10.0.0.1")
    both = rls_pb2.RateLimitRequest(domain="envoy")
    both.descriptors.add().entries.add(key="remote_address", value="10.0.0.1")
    both.descriptors.add().entries.add(key="client_id", value="c")
    await handlers.should_rate_limit(one)
    await handlers.should_rate_limit(both)
    await handlers.rate_limit(ratio_pb2.RateLimitRequest(owner="ann", resource="r"))
    assert len(backend.trees) == 3
    assert not any(t.spreads for t in backend.trees)


async def test_two_overrides_naming_one_ip_count_on_one_counter() -> None:
    """Alice's override counts her ip by ip only, bob's with a rule of no selector: one ip
    they share has one counter (before, alice's kept it under a hash tag of its own, bob's
    in the key's slot: each admitted the ip's one call a minute)."""
    rl = RateLimit(fakeredis.FakeAsyncRedis(), "ov-ip", spread=True, denial_cache=0)
    try:
        await rl.overrides.set("ov", "ip:1/m", user="alice")
        await rl.overrides.set("ov", "ip:1/m | 100/m", user="bob")
        ip = {"ip": "1.2.3.4"}  # a selector only the overrides name: selector= gives it
        alice = rl.limit("user:5/m", user="alice", selector=ip, key="ov")
        bob = rl.limit("user:5/m", user="bob", selector=ip, key="ov")
        assert (await alice.decide()).allowed
        assert not (await bob.decide()).allowed  # the ip's one call was alice's
    finally:
        await rl.aclose()


async def test_routes_sharing_a_key_share_its_counters_where_keys_spread() -> None:
    """docs/web.md's shared cap: ``site`` counted by a route mixing it with ``ip`` and by one
    naming it alone, under one ``key=``: each site has one counter, whatever route counts
    on it (once, the second spread and kept a counter of its own: the cap admitted twice)."""
    pytest.importorskip("starlette")
    from ratelimit.asgi import Route, client_ip
    from tests.test_asgi import app_with, client

    rl = RateLimit(fakeredis.FakeAsyncRedis(), "routes", spread=True, denial_cache=0)
    site = client_ip()
    routes = [
        Route("/login", "ip:5/m | site:3/m", key="site", site=site),
        Route("/*", "site:3/m", key="site", site=site),
    ]
    try:
        async with client(app_with(rl, routes)) as http:
            codes = [(await http.get(path)).status_code for path in ["/login", "/a"] * 2]
        assert codes == [200, 200, 200, 429]
        assert [route.limit.compiled.spreads for route in routes] == [False, True]
    finally:
        await rl.aclose()


@pytest.mark.parametrize("use_scripts", [True, False], ids=["scripts", "commands"])
async def test_concurrency_limits_of_one_key_keep_one_slot_set_per_identifier(
    use_scripts: bool,
) -> None:
    """Two concurrency limits made for one key, ``user:1`` and ``user:1 | 5``: both keep
    alice's slots in one place, her own tag (issue 47: the layout is the identifier's), so
    she holds one slot at a time, as with spread=False (each set apart let her hold two)."""
    client = fakeredis.FakeAsyncRedis()
    rl = RateLimit(client, "slots", spread=True, use_scripts=use_scripts)
    alone = rl.concurrency("user:1", key="jobs", user="alice")
    shared = rl.concurrency("user:1 | 5", key="jobs", user="alice")
    async with alone:
        with pytest.raises(ConcurrencyLimitExceeded):
            async with shared:
                pass
    async with shared:
        with pytest.raises(ConcurrencyLimitExceeded):
            async with alone:
                pass
        keys = {k if isinstance(k, str) else k.decode() for k in await client.keys("*")}
        assert "rl:{slots:jobs:user=alice}:c" in keys  # alice's slots under her own tag
        assert not any(k.startswith("rl:{slots:jobs}:user=") for k in keys), keys
    await rl.aclose()
    await client.aclose()
