"""Penalties while the store fails: holds are not read from it during an outage (no
failing round trip per call on top of the failure policy's, which under on_error="local"
asks the store nothing), a hold this process knows keeps refusing until it ends, and
reading resumes once the store answers. A store that fails on demand, a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from ratelimit import MemoryBackend, RateLimit
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Identifier, Plan
from ratelimit.errors import BackendError
from tests.conftest import FakeClock

pytestmark = pytest.mark.timeout(30)


class Flaky(MemoryBackend):
    """A memory store that fails while ``down``; ``reads``: the holds it was asked for."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.down = False
        self.reads = 0

    async def decide(self, plan: Plan) -> Decision:
        if self.down:
            raise BackendError("store down")
        return await super().decide(plan)

    async def penalty_left(self, target: Identifier) -> float:
        self.reads += 1
        if self.down:
            raise BackendError("store down")
        return await super().penalty_left(target)


@pytest.mark.parametrize("on_error", ["local", "allow", "deny"])
async def test_no_hold_read_during_an_outage_and_known_holds_last(on_error: str) -> None:
    clock = FakeClock()
    store = Flaky(clock)
    rl = RateLimit(store, "o", on_error=on_error)
    penalty = "2 refusals/m for 10m"
    bad = rl.limit("ip:1/h", key="api", ip="bad", penalty=penalty)
    good = rl.limit("ip:100/h", key="api2", ip="good", penalty=penalty)
    for _ in range(3):
        await bad.decide()
    assert (await bad.decide()).penalty == pytest.approx(600)
    store.down = True
    await good.decide()  # the outage starts (its hold read fails, then its decision)
    assert rl._decider.policy.outage_started is not None
    reads = store.reads
    clock.advance(5)  # past what the process trusts without asking (RECHECK)
    for _ in range(20):
        held = await bad.decide()
        assert held.penalty == pytest.approx(595)  # the known hold keeps refusing
        await good.decide()
    assert store.reads == reads  # nothing asked of the failing store for holds
    clock.advance(600)
    assert (await bad.decide()).penalty is None  # the hold ended on time
    store.down = False
    clock.advance(1)
    await good.decide()  # the store answers again (under "local", its probe): the outage ends
    for _ in range(5):
        await asyncio.sleep(0)  # the probe's task runs (turns of the loop, no time)
    assert rl._decider.policy.outage_started is None
    await bad.decide()
    assert store.reads > reads  # holds read from the store again
    await rl.aclose()


@pytest.mark.parametrize("on_error", ["local", "allow", "deny"])
async def test_a_known_hold_keeps_refusing_when_the_store_fails_as_its_trust_ends(
    on_error: str,
) -> None:
    """The process's trust in a hold it read ends (``RECHECK``) and the store dies before
    any outage is noticed: the hold's read fails, and the hold known here still refuses
    to its end (the rules are not asked: under ``"local"`` the share would admit)."""
    clock = FakeClock()
    store = Flaky(clock)
    rl = RateLimit(store, "o", on_error=on_error)
    bad = rl.limit("ip:1/h", key="api", ip="bad", penalty="2 refusals/m for 1h")
    for _ in range(3):
        await bad.decide()
    assert (await bad.decide()).penalty == pytest.approx(3600)
    clock.advance(1.2)  # past what the process trusts without asking (RECHECK)
    store.down = True
    held = await bad.decide()
    assert not held.allowed
    assert held.penalty == pytest.approx(3598.8)
    assert not held.degraded  # a hold known here, not the failure policy's answer
    assert (await bad.decide()).penalty == pytest.approx(3598.8)  # and the next call too
    await rl.aclose()
