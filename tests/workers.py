"""OS processes for the concurrency tests: start them, wait until each says it is ready on
Redis, let them go at once, and collect what each printed."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent


async def run_workers(
    client: aioredis.Redis,
    namespace: str,
    module: str,
    *args: str,
    count: int = 4,
    after_go: Callable[[], Awaitable[object]] | None = None,
) -> list[bytes]:
    """Run ``count`` processes of ``python -m module args...``; each increments
    ``<namespace>:ready`` and waits on a BLPOP of ``<namespace>:go``; ``after_go`` runs
    once they are let go. Returns their output."""
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, *args, cwd=ROOT, stdout=asyncio.subprocess.PIPE
        )
        for _ in range(count)
    ]
    try:
        deadline = time.monotonic() + 30
        while int(await client.get(f"{namespace}:ready") or 0) < count:
            assert time.monotonic() < deadline, "workers did not start"
            assert all(w.returncode is None for w in workers), "a worker died"
            await asyncio.sleep(0.01)  # polling child processes, not waiting for a window
        await client.rpush(f"{namespace}:go", *["go"] * count)
        if after_go is not None:
            await after_go()
        outputs = [await asyncio.wait_for(w.communicate(), 100) for w in workers]
    finally:
        for w in workers:
            if w.returncode is None:
                w.kill()
                await w.wait()
    for w in workers:
        assert w.returncode == 0, f"a worker of {module} failed"
    return [out for out, _ in outputs]
