"""One hot limit over a real three-node Redis Cluster (issue 38): its identifiers spread
over the nodes, each decision still atomic and exact.

4 OS processes (:mod:`tests.spread_worker`) decide ``user:1000/m`` over many users at one
frozen instant (a moving window would let the window algorithms and GCRA admit more,
legitimately): every ordinary user is admitted as often as asked, each hot user exactly
1000 times across the processes, and every node carries at least a quarter of the calls.
A tree that mixes selectors stays in the one slot of its (namespace, key), and so does
every tree under ``spread=False``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.crc import key_slot

from ratelimit.backends.redis.client import CLUSTER_TRANSACTIONS, redis_py_version
from ratelimit.backends.redis.keys import tag
from tests.redis_server import RedisCluster
from tests.workers import run_workers

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300), pytest.mark.long]

INSTANT = 1_800_000_000.0
"""The frozen clock every worker reads (seconds)."""

PROCESSES = 4
LIMIT = 1000
RULE = f"user:{LIMIT}/m"

SIZES = {"script": (10_000, 2, 4, 400), "commands": (1_500, 1, 1, 260)}
"""Per engine: users, calls per user per process, hot users, calls per hot user per process
(the command engine takes a lock per identifier, so a hot user's calls queue on its lock:
fewer calls, the same 4 processes, ordinary users still most of them, so that where the hot
users' slots happen to lie cannot tip a node's share)."""

ALGORITHMS = [
    "sliding-log",
    "gcra",
    # the window counters take the same path through the cluster client: once per CI run
    pytest.param("sliding-window", marks=pytest.mark.once),
    pytest.param("fixed-window", marks=pytest.mark.once),
]

DECISION_COMMAND = {"script": "evalsha", "commands": "exec"}
"""The command each engine sends once per decision (the command engine's decision is
``MULTI``/``EXEC``: one per write, one per lock release)."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    if os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL points at one server; the cluster test starts its own nodes")
    with RedisCluster(nodes=3) as started:
        yield started


def nodes(cluster: RedisCluster) -> list[Any]:
    return [redis.Redis(port=server.port) for server in cluster.servers]


def reset_stats(cluster: RedisCluster) -> None:
    for node in nodes(cluster):
        node.config_resetstat()
        node.close()


def calls_per_node(cluster: RedisCluster, command: str) -> list[int]:
    """How many ``command`` calls each master ran since :func:`reset_stats`."""
    counts = []
    for node in nodes(cluster):
        stats = node.info("commandstats").get(f"cmdstat_{command}", {})
        counts.append(int(stats.get("calls", 0)))
        node.close()
    return counts


def keys_of(cluster: RedisCluster, namespace: str) -> list[bytes]:
    """Every key of ``namespace`` on every master."""
    found: list[bytes] = []
    for node in nodes(cluster):
        found += node.scan_iter(match=f"*{namespace}*", count=1000)
        node.close()
    return found


async def decide_in_processes(
    control: aioredis.Redis,
    cluster: RedisCluster,
    namespace: str,
    *args: str,
) -> list[dict[str, Any]]:
    outputs = await run_workers(
        control,
        namespace,
        "tests.spread_worker",
        control_url(control),
        namespace,
        cluster.url,
        *args,
        count=PROCESSES,
    )
    return [json.loads(out) for out in outputs]


def control_url(client: aioredis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/0"


def hot_totals(results: list[dict[str, Any]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for result in results:
        for name, admitted in result["hot"].items():
            totals[name] = totals.get(name, 0) + admitted
    return totals


def needs_cluster_transactions(engine: str) -> None:
    if engine == "commands" and redis_py_version() < CLUSTER_TRANSACTIONS:
        pytest.skip("the command engine on a cluster needs redis-py 6.2 or later")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    # the command engine's runs are the slowest (a lock per user): once per CI run
    "engine",
    ["script", pytest.param("commands", marks=pytest.mark.once)],
)
async def test_one_hot_limit_spreads_over_three_nodes(
    cluster: RedisCluster,
    redis_client: aioredis.Redis,
    namespace: str,
    engine: str,
    algorithm: str,
) -> None:
    needs_cluster_transactions(engine)
    users, repeats, hot_users, hot_calls = SIZES[engine]
    reset_stats(cluster)
    started = time.monotonic()
    results = await decide_in_processes(
        redis_client,
        cluster,
        namespace,
        algorithm,
        engine,
        "auto",
        RULE,
        str(INSTANT),
        *(str(n) for n in (users, repeats, hot_users, hot_calls)),
    )
    elapsed = time.monotonic() - started
    calls = calls_per_node(cluster, DECISION_COMMAND[engine])
    shares = [n / sum(calls) for n in calls]
    decisions = PROCESSES * (users * repeats + hot_users * hot_calls)
    print(
        f"{engine} {algorithm}: {decisions} decisions by {PROCESSES} processes in "
        f"{elapsed:.1f} s; {DECISION_COMMAND[engine]} per node {calls} "
        f"(shares {', '.join(f'{s:.1%}' for s in shares)})"
    )
    assert all(result["degraded"] == 0 for result in results)
    assert sum(result["ordinary"] for result in results) == PROCESSES * users * repeats
    assert hot_totals(results) == {f"hot{n}": LIMIT for n in range(hot_users)}
    assert min(shares) >= 0.25, calls


async def test_one_hot_limit_on_the_nodes_own_clocks(
    cluster: RedisCluster, redis_client: aioredis.Redis, namespace: str
) -> None:
    """No injected clock: each decision reads the time of the node its keys are on (the
    script's ``TIME``). Per hour, so that a slow run cannot let a window move."""
    reset_stats(cluster)
    results = await decide_in_processes(
        redis_client, cluster, namespace, "sliding-log", "script", "auto", f"user:{LIMIT}/h",
        "server", "2000", "1", "2", "300",
    )  # fmt: skip
    calls = calls_per_node(cluster, "evalsha")
    assert sum(result["ordinary"] for result in results) == PROCESSES * 2000
    assert hot_totals(results) == {"hot0": LIMIT, "hot1": LIMIT}
    assert min(n / sum(calls) for n in calls) >= 0.25, calls


@pytest.mark.parametrize("engine", ["script", "commands"])
async def test_a_tree_that_mixes_in_a_global_rule_is_decided_by_parts(
    cluster: RedisCluster, redis_client: aioredis.Redis, namespace: str, engine: str
) -> None:
    """``user:40/h | 100/h`` counts every user on one global rule too: each user's counters
    in the user's slot, the global rule's in the key's, a call decided by parts (issue 47).
    4 processes over 300 users and 2 hot ones: exactly 100 admitted in all, no user more
    than 40, and the keys lie in many slots."""
    needs_cluster_transactions(engine)
    results = await decide_in_processes(
        redis_client,
        cluster,
        namespace,
        "sliding-log",
        engine,
        "auto",
        "user:40/h | 100/h",
        str(INSTANT),
        "300",
        "1",
        "2",
        "30",
    )
    hot = hot_totals(results)
    assert all(result["degraded"] == 0 for result in results)
    assert sum(result["ordinary"] for result in results) + sum(hot.values()) == 100
    assert max(hot.values()) <= 40
    assert len({key_slot(key) for key in keys_of(cluster, namespace)}) > 1


@pytest.mark.parametrize("algorithm", ["sliding-log", "gcra"])
@pytest.mark.parametrize("engine", ["script", "commands"])
async def test_a_rolling_deploy_of_new_rules_keeps_one_counter_per_user(
    cluster: RedisCluster,
    redis_client: aioredis.Redis,
    namespace: str,
    engine: str,
    algorithm: str,
) -> None:
    """Issue 47, item 7: two processes with ``user:3/h``, two with the new rules
    ``user:3/h | 1000/h``, side by side on the cluster (spread by default): every user
    admitted exactly 3 times in all (before, each tree kept its own counter: 3 more per
    user), whichever processes the calls reached."""
    needs_cluster_transactions(engine)
    results = await decide_in_processes(
        redis_client, cluster, namespace, algorithm, engine, "auto",
        "user:3/h;user:3/h | 1000/h", str(INSTANT), "150", "2", "2", "12",
    )  # fmt: skip
    assert all(result["degraded"] == 0 for result in results)
    assert sum(result["ordinary"] for result in results) == 150 * 3
    assert hot_totals(results) == {"hot0": 3, "hot1": 3}


async def test_spread_false_keeps_one_slot_on_a_cluster(
    cluster: RedisCluster, redis_client: aioredis.Redis, namespace: str
) -> None:
    """``spread=False``: a tree that would spread keeps every key in the slot of its
    (namespace, key), as before spreading existed, and every call goes to that node."""
    reset_stats(cluster)
    results = await decide_in_processes(
        redis_client,
        cluster,
        namespace,
        "sliding-log",
        "script",
        "off",
        RULE,
        str(INSTANT),
        "500",
        "1",
        "1",
        "300",
    )
    assert sum(result["ordinary"] for result in results) == PROCESSES * 500
    assert hot_totals(results) == {"hot0": LIMIT}
    assert_one_slot(cluster, namespace)
    assert sorted(calls_per_node(cluster, "evalsha"))[:2] == [0, 0]


def assert_one_slot(cluster: RedisCluster, namespace: str) -> None:
    keys = keys_of(cluster, namespace)
    assert keys
    pinned = key_slot(tag(namespace, "spread").encode())
    assert {key_slot(key) for key in keys} == {pinned}
