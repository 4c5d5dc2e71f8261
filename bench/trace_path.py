"""Which modules one decision passes through: the Python functions called during one
decorated call, by module, traced with ``sys.setprofile``.

    python bench/trace_path.py [--store memory|redis|both] [--algorithm sliding-log]

``@rl.limit("user:3/m")`` on ``async def work(user)``; after a warm-up (plans, scripts,
connections made), one call for a user already seen is traced from the moment it is
called until it returns, every coroutine and callback the event loop runs meanwhile
included (on Redis: the pipeline's flush and the reply's reading). Prints, per store, the
package's modules in the order first entered, the count of distinct functions, the moves
between modules, and the other libraries' modules (redis-py, asyncio) on the way. On Redis
it starts its own redis-server (or uses ``REDIS_URL``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ratelimit import RateLimit
from tests.redis_server import RedisServer

PACKAGE = str(Path(__file__).resolve().parent.parent / "ratelimit")


def module_of(filename: str) -> str:
    if filename.startswith(PACKAGE):
        return "ratelimit" + filename[len(PACKAGE) :].removesuffix(".py").replace("/", ".")
    for marker in ("site-packages/", "lib/python3"):
        at = filename.find(marker)
        if at >= 0:
            return "(" + filename[at + len(marker) :].lstrip("0123456789./").split("/")[0] + ")"
    return f"({Path(filename).stem})"


async def traced(url: str, algorithm: str) -> None:
    rl = RateLimit.from_url(url, "trace", algorithm=algorithm)

    @rl.limit("user:3/m")
    async def work(user: str) -> bool:
        return True

    for _ in range(2):
        await work("warm")
    calls: list[tuple[str, str]] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            calls.append((module_of(code.co_filename), code.co_qualname))

    sys.setprofile(profile)
    try:
        await work("warm")
    finally:
        sys.setprofile(None)
    await rl.aclose()
    ours = [(m, f) for m, f in calls if m.startswith("ratelimit") and f != "work"]
    modules = list(dict.fromkeys(m for m, _ in ours))
    moves = sum(1 for a, b in itertools.pairwise(ours) if a[0] != b[0])
    others = sorted({m for m, _ in calls if not m.startswith("ratelimit") and m != "(trace_path)"})
    print(f"## {url.split(':')[0]}, {algorithm}\n")
    print(f"- package modules ({len(modules)}): {', '.join(modules)}")
    print(f"- distinct package functions: {len(set(ours))}; calls: {len(ours)}; moves: {moves}")
    print(f"- other modules: {', '.join(others) or 'none'}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", choices=("memory", "redis", "both"), default="both")
    parser.add_argument("--algorithm", default="sliding-log")
    args = parser.parse_args()
    with ExitStack() as stack:
        urls = []
        if args.store in ("memory", "both"):
            urls.append("memory://")
        if args.store in ("redis", "both"):
            url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
            urls.append(url)
        for url in urls:
            asyncio.run(traced(url, args.algorithm))


if __name__ == "__main__":
    main()
