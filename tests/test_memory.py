"""The memory backend: bounded memory, thread safety."""

from __future__ import annotations

import asyncio
import threading

from ratelimit import Decision, MemoryBackend, RateLimit
from tests.conftest import FakeClock


async def test_expired_identifiers_are_swept_away() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock, sweep_every=100)
    rl = RateLimit(backend, "mem", denial_cache=0)  # every decision reaches the store
    for n in range(5000):
        assert (await rl.limit("user:1/s | user:5/m", key="sweep", user=n).decide()).allowed
    assert len(backend) == 5000
    clock.advance(60)  # every log is now older than the largest span (5/m)
    # swept within as many decisions as identifiers are held (5000): a sweep walks them all
    for n in range(5100):
        await rl.limit("user:1/s | user:5/m", key="sweep", user=f"new{n % 100}").decide()
    assert len(backend) == 100


async def test_a_sweep_comes_every_sweep_every_decisions_while_few_are_held() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock, sweep_every=10)
    rl = RateLimit(backend, "mem")
    for n in range(5):
        await rl.limit("user:5/m", key="sweep", user=n).decide()
    clock.advance(60)
    for _ in range(10):
        await rl.limit("user:5/m", key="sweep", user="new").decide()
    assert len(backend) == 1


async def test_a_log_younger_than_its_largest_span_is_kept() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock, sweep_every=1)
    rl = RateLimit(backend, "mem")
    limit = rl.limit("1/s | 2/m", key="keep")
    assert (await limit.decide()).allowed
    clock.advance(30)  # past 1/s but inside 2/m: the hit must still count
    assert (await limit.decide()).allowed
    assert not (await limit.decide()).allowed
    assert len(backend) == 1


def test_threads_with_their_own_loops_share_one_backend_safely() -> None:
    backend = MemoryBackend()
    rl = RateLimit(backend, "mem")
    admitted: list[int] = []

    async def burst() -> int:
        limit = rl.limit("100/m", key="threads")
        return sum([(await limit.decide()).allowed for _ in range(50)])

    def run() -> None:
        admitted.append(asyncio.run(burst()))

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 100


async def test_aclose_forgets_everything() -> None:
    backend = MemoryBackend()
    rl = RateLimit(backend, "mem")
    await rl.limit("1/m", key="x").decide()
    await rl.aclose()
    assert len(backend) == 0


async def test_the_single_rule_shortcut_decides_as_the_general_path() -> None:
    """MemoryBackend._decide_one is a copy of the general path for one rule (it pays 1.5x,
    bench/fast_paths.py): both decide a trace alike, and keep the same log."""
    from ratelimit.core.plan import Plan

    class General(MemoryBackend):
        def _decide_one(self, plan: Plan, now: int) -> Decision:
            return self._decide_logs(plan, now)

    clocks = [FakeClock(), FakeClock()]
    backends = [MemoryBackend(clock=clocks[0]), General(clock=clocks[1])]
    limiters = [RateLimit(b, "ns", denial_cache=0) for b in backends]
    for step in range(200):
        for clock in clocks:
            clock.advance((step * 7919 % 13) / 10)
        cost = 1 + step % 3
        decisions = [
            await rl.limit("user:5/3s", key="k", cost=cost, user=f"u{step % 4}").decide()
            for rl in limiters
        ]
        assert decisions[0] == decisions[1], step
    assert backends[0].logs() == backends[1].logs()
