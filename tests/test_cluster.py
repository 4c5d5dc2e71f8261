"""A real three-node Redis Cluster: one decision touches one slot, so no CROSSSLOT."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.crc import key_slot

from ratelimit import ConfigurationError, RateLimit, RateLimitExceeded
from ratelimit.backends.redis.client import CLUSTER_TRANSACTIONS, redis_py_version
from ratelimit.backends.redis.keys import lock_key, tag
from tests.redis_server import RedisCluster

pytestmark = [pytest.mark.redis, pytest.mark.long]


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    if os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL points at one server; the cluster test starts its own nodes")
    with RedisCluster() as cluster:
        yield cluster.url


@pytest.fixture
async def cluster_client(cluster_url: str) -> AsyncIterator[AsyncRedisCluster]:
    client = AsyncRedisCluster.from_url(cluster_url)
    yield client
    await client.aclose()


@pytest.mark.parametrize("algorithm", ["sliding-log", "sliding-window", "gcra"])
@pytest.mark.parametrize("use_scripts", [True, False], ids=["script", "commands"])
async def test_trees_over_many_selectors_run_on_a_cluster(
    cluster_client: AsyncRedisCluster, namespace: str, use_scripts: bool, algorithm: str
) -> None:
    if not use_scripts and redis_py_version() < CLUSTER_TRANSACTIONS:
        with pytest.raises(ConfigurationError, match="needs redis-py 6.2 or later"):
            RateLimit(cluster_client, namespace, use_scripts=False, algorithm=algorithm)
        return
    rl = RateLimit(cluster_client, namespace, use_scripts=use_scripts, algorithm=algorithm)
    nodes_used = set()
    for n in range(12):  # different keys land on different nodes
        key = f"endpoint-{n}"

        @rl.limit("(user:2/m & ip:2/m) | 3/m", key=key)
        async def work(user: str, ip: str) -> None: ...

        assert [await _admitted(work, "u", "1.1.1.1") for _ in range(4)] == [1, 1, 0, 0]
        slot = key_slot(tag(namespace, key).encode())  # the tree mixes user and ip: pinned
        nodes_used.add(cluster_client.nodes_manager.get_node_from_slot(slot).name)
    assert len(nodes_used) > 1


async def _admitted(work: object, user: str, ip: str) -> int:
    assert callable(work)
    try:
        await work(user, ip)
    except RateLimitExceeded:
        return 0
    return 1


async def test_concurrent_decisions_pipeline_across_nodes(
    cluster_client: AsyncRedisCluster, namespace: str
) -> None:
    """Auto-pipelined batches span keys on several nodes; each key still counts exactly,
    and a flushed script is loaded again on every node once per batch."""
    # a deadline far past the scripts' reload on three nodes of a loaded machine: this is
    # about reloading, not speed (the default 0.25 s failed once beside two CPU burners)
    rl = RateLimit(cluster_client, namespace, denial_cache=0, timeout=10)
    limits = [rl.limit("10/m", key=f"endpoint-{n}") for n in range(6)]
    decisions = await asyncio.gather(*(lim.decide() for lim in limits for _ in range(25)))
    for n in range(6):
        assert sum(d.allowed for d in decisions[n * 25 : (n + 1) * 25]) == 10
    await cluster_client.script_flush()
    again = await asyncio.gather(*(rl.limit("10/m", key=f"fresh-{n}").decide() for n in range(30)))
    assert all(d.allowed and not d.degraded for d in again)


@pytest.mark.parametrize("use_scripts", [True, False], ids=["script", "commands"])
def test_a_cluster_limiter_in_event_loop_after_event_loop(
    cluster_url: str, namespace: str, use_scripts: bool
) -> None:
    """The nodes' connections that an ended loop opened are opened anew in the next one
    (was: "Event loop is closed", raw past on_error on the command engine)."""
    if not use_scripts and redis_py_version() < CLUSTER_TRANSACTIONS:
        pytest.skip("the command engine needs redis-py 6.2 on a cluster (tested above)")
    client = AsyncRedisCluster.from_url(cluster_url)
    rl = RateLimit(client, namespace, use_scripts=use_scripts, on_error="raise")
    limit = rl.limit("5/h", key="loops")

    async def three() -> list[bool]:
        return [(await limit.decide()).allowed for _ in range(3)]

    assert asyncio.run(three()) == [True, True, True]
    assert asyncio.run(three()) == [True, True, False]

    async def close() -> None:
        await rl.aclose()
        await client.aclose()

    asyncio.run(close())


async def test_the_lock_waits_and_wakes_within_one_slot(cluster_url: str, namespace: str) -> None:
    """Two limiters (as two processes) contend for one key's lock: the waiters block on the
    wake-up list beside the lock, each release wakes one in the transaction of its delete
    (lock and list share the hash tag: no CROSSSLOT), and the limit counts exactly."""
    if redis_py_version() < CLUSTER_TRANSACTIONS:
        pytest.skip("use_scripts=False on a cluster needs redis-py 6.2")
    clients = [AsyncRedisCluster.from_url(cluster_url) for _ in range(2)]
    limiters = [
        RateLimit(client, namespace, use_scripts=False, denial_cache=0, on_error="raise")
        for client in clients
    ]
    decisions = await asyncio.gather(
        *(rl.limit("20/m", key="hot").decide() for rl in limiters for _ in range(25))
    )
    assert sum(d.allowed for d in decisions) == 20
    assert not any(d.degraded for d in decisions)
    lock = lock_key(tag(namespace, "hot"))  # a rule without a selector: pinned
    assert await clients[0].exists(f"{lock}:wake")  # releases woke
    assert not await clients[0].exists(lock)
    for client in clients:
        await client.aclose()


@pytest.mark.parametrize("algorithm", ["sliding-log", "sliding-window", "gcra"])
@pytest.mark.parametrize("use_scripts", [True, False], ids=["script", "commands"])
async def test_settles_on_a_cluster_stay_in_their_slot(
    cluster_client: AsyncRedisCluster, namespace: str, use_scripts: bool, algorithm: str
) -> None:
    """A settle touches the keys its decision did (requests and tokens counters of one
    key), all in one slot, on whichever node holds it: no CROSSSLOT."""
    if not use_scripts and redis_py_version() < CLUSTER_TRANSACTIONS:
        pytest.skip("the command engine on a cluster needs redis-py 6.2 or later")
    rl = RateLimit(cluster_client, namespace, use_scripts=use_scripts, algorithm=algorithm)
    for n in range(6):  # keys on several nodes
        limit = rl.limit("api:5/m | api:100 tokens/m", key=f"llm-{n}", api="k")
        decision = await limit.decide(cost={"tokens": 60})
        assert await limit.settle(decision, {"tokens": 10})  # 50 back
        excess = await limit.decide(cost={"tokens": 60})
        assert await limit.settle(excess, {"tokens": 95})  # 35 more: 105 of 100
        refused = await limit.decide(cost={"tokens": 1})
        assert not refused.allowed
        assert str(refused.rule) == "api:100 tokens/m"


async def test_batched_script_calls_keep_to_one_slot_each(
    cluster_client: AsyncRedisCluster, namespace: str
) -> None:
    """Concurrent calls of limits on several nodes: each batch script call carries one hash
    tag's calls (one slot), and every limit admits exactly its count."""
    rl = RateLimit(cluster_client, namespace, denial_cache=0)
    limits = [rl.limit("user:3/m", key=f"endpoint-{n % 6}", user="u") for n in range(24)]
    lead = rl.limit("user:3/m", key="lead", user="x").decide()
    decisions = (await asyncio.gather(lead, *(limit.decide() for limit in limits)))[1:]
    admitted: dict[str, int] = {}
    for decision in decisions:
        admitted[decision.key] = admitted.get(decision.key, 0) + decision.allowed
    assert admitted == {f"endpoint-{n}": 3 for n in range(6)}
    # the 24 (one batch: at most MAX_BATCH) went as one script call per tag: 4 calls each
    assert max(rl.storage.calls_per_script) == 4  # type: ignore[attr-defined]
    await rl.aclose()
