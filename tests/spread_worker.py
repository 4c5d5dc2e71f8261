"""One OS process deciding one limit over many users on a Redis Cluster (issue 38).

``python -m tests.spread_worker CONTROL_URL NAMESPACE CLUSTER_URL ALGORITHM ENGINE SPREAD
RULE INSTANT USERS REPEATS HOT_USERS HOT_CALLS``: ENGINE ``script`` or ``commands``
(``use_scripts=False``); SPREAD ``auto`` (the default ``spread=None``: spreads on a cluster
client) or ``off`` (``spread=False``); INSTANT the frozen clock's reading (seconds: every
process decides at the same instant, so no window moves and no algorithm may admit more),
or ``server``: no injected clock, each node's own ``TIME``).

It says it is ready on the control Redis, waits for the go (a BLPOP), then decides RULE
(``key="spread"``; ``A;B``: the processes take rules ``A`` and ``B`` in turn, as old and new
processes of a rolling deploy) for users ``u0`` .. ``u<USERS-1>`` REPEATS times each and for users
``hot0`` .. ``hot<HOT_USERS-1>`` HOT_CALLS times each, shuffled, from :data:`CONCURRENCY`
coroutines (so the client pipelines their calls; fewer for the command engine, whose hot
users' calls queue on their locks). Prints one JSON object: ``ordinary`` (admitted
calls of the ``u`` users), ``hot`` (admitted calls per hot user), ``degraded`` (decisions
Redis did not answer: must be 0).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from ratelimit import RateLimit
from ratelimit.core.plan import compile_tree
from ratelimit.rules.tree import to_tree

CONCURRENCY = {"script": 64, "commands": 16}
SPREAD = {"auto": None, "off": False}


def limiter(
    client: RedisCluster,
    namespace: str,
    algorithm: str,
    engine: str,
    spread: str,
    instant: float | None,
) -> RateLimit:
    options: dict[str, Any] = {}
    if engine == "commands":
        options = {"use_scripts": False, "lock_timeout": 60.0}
    return RateLimit(
        client,
        namespace,
        algorithm=algorithm,
        spread=SPREAD[spread],
        clock=None if instant is None else lambda: instant,
        timeout=5.0,  # a generous deadline: exact counts, on a loaded machine
        on_error="raise",  # a decision Redis did not answer fails the run, never admits
        denial_cache=0,  # every call asks Redis (the calls per node are what is measured)
        **options,
    )


async def main(argv: list[str]) -> str:
    control_url, namespace, cluster_url, algorithm, engine, spread, rule = argv[:7]
    instant = None if argv[7] == "server" else float(argv[7])
    users, repeats, hot_users, hot_calls = (int(a) for a in argv[8:12])
    client = RedisCluster.from_url(cluster_url)
    rl = limiter(client, namespace, algorithm, engine, spread, instant)
    names = [f"u{n}" for n in range(users) for _ in range(repeats)]
    names += [f"hot{n}" for n in range(hot_users) for _ in range(hot_calls)]
    random.Random(os.getpid()).shuffle(names)
    await client.initialize()  # the cluster's slots known before the go
    control = aioredis.Redis.from_url(control_url)
    ready = await control.incr(f"{namespace}:ready")
    rules = rule.split(";")  # several: the processes take them in turn (a rolling deploy)
    tree = compile_tree(to_tree(rules[(ready - 1) % len(rules)]))
    await control.blpop([f"{namespace}:go"], timeout=60)
    admitted: dict[str, int] = {}
    degraded = 0
    calls = iter(names)

    async def caller() -> None:
        nonlocal degraded
        for name in calls:
            decision = await rl.decide(tree, "spread", (name,))
            admitted[name] = admitted.get(name, 0) + decision.allowed
            degraded += decision.degraded

    await asyncio.gather(*(caller() for _ in range(CONCURRENCY[engine])))
    await rl.aclose()
    await client.aclose()
    await control.aclose()
    return json.dumps(
        {
            "ordinary": sum(n for name, n in admitted.items() if name.startswith("u")),
            "hot": {name: n for name, n in admitted.items() if name.startswith("hot")},
            "degraded": degraded,
        }
    )


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1:])))
