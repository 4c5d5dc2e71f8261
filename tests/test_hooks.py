"""Hooks see every decision: allowed, denied (from the store or the denial cache), degraded."""

from __future__ import annotations

import logging

import pytest

from ratelimit import BackendError, MemoryBackend, RateLimit
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan
from tests.conftest import FakeClock


async def test_every_decision_reaches_every_hook(clock: FakeClock) -> None:
    seen: list[Decision] = []
    also: list[bool] = []
    rl = RateLimit(
        MemoryBackend(clock=clock), "h", hooks=[seen.append, lambda d: also.append(d.allowed)]
    )
    limit = rl.limit("user:2/m", key="k", user="u")
    for _ in range(4):  # two admitted, one refused by the store, one by the denial cache
        await limit.decide()
    assert [d.allowed for d in seen] == [True, True, False, False]
    assert also == [True, True, False, False]
    assert all(d.key == "k" for d in seen)
    assert str(seen[2].rule) == "user:2/m"
    assert seen[3].retry_after == pytest.approx(60.0)


async def test_degraded_decisions_reach_hooks(clock: FakeClock) -> None:
    class Failing(MemoryBackend):
        async def decide(self, plan: Plan) -> Decision:
            raise BackendError("down")

    seen: list[Decision] = []
    rl = RateLimit(Failing(clock=clock), "h", hooks=[seen.append])
    await rl.limit("1/m", key="k").decide()
    assert seen[0].degraded
    assert seen[0].allowed


async def test_a_failing_hook_is_logged_once_and_never_breaks_a_decision(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counted: list[Decision] = []

    def broken(decision: Decision) -> None:
        raise ZeroDivisionError("metrics backend is down")

    rl = RateLimit(MemoryBackend(), "h", hooks=[broken, counted.append])
    with caplog.at_level(logging.ERROR, logger="ratelimit"):
        for _ in range(5):
            assert (await rl.limit("10/m", key="k").decide()).allowed
    assert len(counted) == 5  # the hooks after it still ran
    failures = [r for r in caplog.records if r.name == "ratelimit"]
    assert len(failures) == 1  # logged once, not once per decision
    assert "metrics backend is down" in caplog.text


def test_hooks_must_be_callable() -> None:
    with pytest.raises(TypeError, match="a hook must be callable, not int"):
        RateLimit(MemoryBackend(), hooks=[5])  # type: ignore[list-item]
