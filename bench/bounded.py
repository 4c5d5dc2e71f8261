"""Issue 39's bounded failures: what each costs per decision, unused and used.

    python bench/bounded.py [SECTION ...] [--seconds 2] [--rounds 3] [--smoke]

Sections (named on the command line; none named: all of them):

- ``local``: ``on_error="local"`` against ``"allow"``: decisions per second and client CPU
  per decision (``time.process_time``) of one decorated plain limit (the direct path),
  sequential calls cycling over 1 000 users under ``user:100000/h``: on a healthy store
  (``memory://``, a private redis-server: the setting unused, which should cost nothing),
  and on a dead store (a memory store that raises, a redis-server stopped: its port
  refuses), where ``"allow"`` answers fail-open and ``"local"`` decides on its share.

Each measurement runs ``--rounds`` times, alternating the variants, and the best round is
reported (the least disturbed by other work on the machine). ``--smoke``: one short round
each, to check the bench runs.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ratelimit import MemoryBackend, RateLimit, Settings
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan
from ratelimit.errors import BackendError
from tests.redis_server import RedisServer

USERS = [f"user{n}" for n in range(1000)]


class DeadMemory(MemoryBackend):
    """A memory store whose every decision fails, as a dead Redis's would."""

    async def decide(self, plan: Plan) -> Decision:
        raise BackendError("store down")


async def rate(rl: RateLimit, seconds: float) -> tuple[float, float, int]:
    """(decisions per second, client CPU µs per decision, degraded decisions) of one
    decorated ``user:100000/h`` limit called in a loop for ``seconds``."""

    @rl.limit("user:100000/h", key="bench")
    async def call(user: str) -> None:
        return None

    for user in USERS[:100]:  # warm: plans, connections, scripts
        await call(user)
    calls = 0
    cpu, wall = time.process_time(), time.perf_counter()
    end = wall + seconds
    while time.perf_counter() < end:
        for user in USERS:
            await call(user)
        calls += len(USERS)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    degraded = 1 if rl.storage_failing else 0
    return calls / wall, cpu / calls * 1e6, degraded


async def best(
    variants: Mapping[str, Callable[[], RateLimit]], seconds: float, rounds: int
) -> dict[str, tuple[float, float, int]]:
    """Each variant's best round (the most decisions per second), variants alternating."""
    found: dict[str, tuple[float, float, int]] = {}
    for _ in range(rounds):
        for name, make in variants.items():
            rl = make()
            measured = await rate(rl, seconds)
            await rl.aclose()
            if name not in found or measured[0] > found[name][0]:
                found[name] = measured
    return found


async def section_local(args: argparse.Namespace) -> None:
    """``on_error="local"`` against ``"allow"``, healthy and dead stores, memory and Redis."""
    print("## local: on_error='local' against 'allow' (direct path, one decorated limit)")
    print(f"{'store':<26} {'on_error':<8} {'decisions/s':>12} {'CPU µs/decision':>16}")
    with RedisServer() as server:
        dead = RedisServer()  # a port nothing listens on: connection refused
        stores: dict[str, Callable[[str], RateLimit]] = {
            "memory, healthy": lambda e: RateLimit(MemoryBackend(), settings=_policy(e)),
            "redis, healthy": lambda e: RateLimit.from_url(server.url, settings=_policy(e)),
            "memory, dead": lambda e: RateLimit(DeadMemory(), settings=_policy(e)),
            "redis, dead (refused)": lambda e: RateLimit.from_url(dead.url, settings=_policy(e)),
        }
        for store, make in stores.items():
            variants = {e: functools.partial(make, e) for e in ("allow", "local")}
            found = await best(variants, args.seconds, args.rounds)
            for name, (per_second, cpu_us, _) in found.items():
                print(f"{store:<26} {name:<8} {per_second:>12,.0f} {cpu_us:>16.2f}")


def _policy(on_error: str) -> Settings:
    return Settings(on_error="local", local_share=0.25) if on_error == "local" else Settings()


SECTIONS: dict[str, Callable[[argparse.Namespace], Awaitable[None]]] = {
    "local": section_local,
}
"""Each section by name: another part of issue 39 adds its own here."""


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("sections", nargs="*", choices=[*SECTIONS, []], metavar="SECTION")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one short round each")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seconds, args.rounds = 0.05, 1
    for name in args.sections or list(SECTIONS):
        await SECTIONS[name](args)


if __name__ == "__main__":
    import logging

    logging.getLogger("ratelimit").setLevel(logging.ERROR)  # the dead stores' outage warnings
    asyncio.run(main())
