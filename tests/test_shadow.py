"""Shadow mode: decided and counted as usual, refusals reported, every call let through."""

from __future__ import annotations

import logging

import pytest

from ratelimit import Decision, MemoryBackend, RateLimit, Settings
from tests.conftest import FakeClock


def watched(**settings: object) -> tuple[RateLimit, list[Decision]]:
    seen: list[Decision] = []
    rl = RateLimit(MemoryBackend(clock=FakeClock()), "ns", hooks=[seen.append], **settings)  # type: ignore[arg-type]
    return rl, seen


async def test_a_shadow_limit_lets_refused_calls_through_and_reports_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rl, seen = watched()
    ran = 0

    @rl.limit("user:3/m", shadow=True)
    async def work(user: str) -> None:
        nonlocal ran
        ran += 1

    with caplog.at_level(logging.INFO, logger="ratelimit.shadow"):
        for _ in range(5):
            await work("vova")
    assert ran == 5  # nothing refused
    assert [d.allowed for d in seen] == [True, True, True, False, False]
    assert [d.shadow for d in seen] == [False, False, False, True, True]
    assert str(seen[3].rule) == "user:3/m"
    assert seen[3].retry_after > 0
    assert caplog.text.count("shadow mode let through a call of key") == 2
    assert "refused by rule 'user:3/m'" in caplog.text
    # counted as usual: only the three admitted hits were recorded
    assert [len(hits) for hits in rl.storage.logs().values()] == [3]  # type: ignore[attr-defined]


async def test_shadow_applies_to_async_with_decide_and_waiting() -> None:
    rl, seen = watched()
    limit = rl.limit("2/h", key="k", shadow=True, wait=3600)
    for _ in range(3):
        async with limit as decision:  # an hour's wait= is never waited in shadow mode
            pass
    assert decision.shadow
    assert not decision.allowed
    decided = await limit.decide()
    assert decided.shadow
    assert not decided.allowed
    peeked = await limit.peek()
    assert peeked.shadow
    assert not peeked.allowed
    assert len(seen) == 5


async def test_a_limiter_in_shadow_mode_and_a_limit_that_enforces() -> None:
    rl, _ = watched(shadow=True)
    assert rl.settings.shadow
    watching = rl.limit("1/h", key="watched")
    enforcing = rl.limit("1/h", key="enforced", shadow=False)
    assert (await watching.decide()).allowed
    assert (await watching.decide()).shadow
    assert (await enforcing.decide()).allowed
    refused = await enforcing.decide()
    assert not refused.allowed
    assert not refused.shadow


async def test_a_shadow_refusal_is_a_refusal_for_limits_that_enforce_the_same_rules() -> None:
    """Shadow changes what the front end does, not what is counted or remembered."""
    rl, _ = watched()
    shadow = rl.limit("2/h", key="shared", shadow=True)
    enforced = rl.limit(key="shared")
    for _ in range(3):
        await shadow.decide()
    assert not (await enforced.decide()).allowed


async def test_a_degraded_refusal_is_let_through_in_shadow_mode() -> None:
    class Down(MemoryBackend):
        async def decide(self, plan: object) -> Decision:
            from ratelimit import BackendError

            raise BackendError("down")

    rl = RateLimit(Down(), "ns", on_error="deny", shadow=True)

    @rl.limit("5/s")
    async def work() -> str:
        return "ran"

    assert await work() == "ran"
    decision = await rl.limit("5/s", key="d").decide()
    assert decision.degraded
    assert decision.shadow
    assert not decision.allowed


def test_shadow_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="shadow must be True or False"):
        Settings(shadow="yes")  # type: ignore[arg-type]
    rl = RateLimit(MemoryBackend())
    with pytest.raises(TypeError, match="shadow must be True or False"):
        rl.limit("5/s", shadow=1)  # type: ignore[call-overload]
