"""Settings made once (say, from a configuration file) and shared by two limiters.

    python examples/settings.py                                   # in-process memory://
    REDIS_URL=redis://localhost:6379/0 python examples/settings.py   # shared via Redis

``Settings`` is checked when it is made: a bad value fails here, naming the setting, before
any limiter or Redis connection exists.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ratelimit import ConfigurationError, RateLimit, Settings

CONFIG: dict[str, Any] = {  # as read from a TOML or YAML file
    "algorithm": "sliding-window",
    "on_error": "deny",
    "denial_cache": 1000,
}


async def main() -> None:
    url = os.environ.get("REDIS_URL", "memory://")
    settings = Settings(namespace="settings-example", **CONFIG)
    try:
        settings.replace(on_error="ignore")
    except ConfigurationError as exc:
        print(f"refused when made: {exc}")

    # Keywords that are not settings go to redis-py (here the pool's size).
    redis_options: dict[str, Any] = {"max_connections": 8} if url.startswith("redis") else {}
    async with (
        RateLimit.from_url(url, settings=settings, **redis_options) as api,
        RateLimit.from_url(url, "settings-admin", settings=settings, **redis_options) as admin,
    ):
        chosen = api.settings
        print(f"api runs with algorithm={chosen.algorithm}, on_error={chosen.on_error}")
        for name, rl in (("api", api), ("admin", admin)):  # two namespaces, one set of settings
            limit = rl.limit("3/m", key="report")
            admitted = [(await limit.decide()).allowed for _ in range(5)]
            print(f"{name}: {sum(admitted)} of 5 admitted under 3/m")


if __name__ == "__main__":
    asyncio.run(main())
