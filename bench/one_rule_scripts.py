"""Redis's time per decision in each algorithm's general script and in its script for one
rule (``sliding_log_one.lua``, ``gcra_one.lua``), sent alone and in a batch of 64.

    python bench/one_rule_scripts.py [--rounds 7] [--users 5000]

Starts its own redis-server (the stats are reset, so never someone else's) and, per round,
alternates the two scripts on the same arguments (``user:1000/m``, each user's keys as
:func:`~ratelimit.backends.redis.script.scripts.plan_command` builds them, Redis's clock): every
user once on an empty server (new), then every user again (returning: admitted,
recorded).
Prints the median of the rounds of ``INFO commandstats``' ``EVALSHA`` time per decision,
and one-rule / general. What it isolates is what the one-rule scripts save: the general
script's tree parsing and helpers, which a batch pays once for its calls.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ratelimit.backends.redis.resp import Command
from ratelimit.backends.redis.script.batch import BATCH, batch_command
from ratelimit.backends.redis.script.scripts import BY_ALGORITHM, plan_command
from ratelimit.core.plan import cached_plan, compile_tree
from ratelimit.rules.tree import to_tree
from tests.redis_server import RedisServer

ALGORITHMS = ("sliding-log", "gcra")
BATCH_SIZE = 64


def commands(algorithm: str, users: int, general: bool) -> list[Command]:
    """One decision per user on fresh keys, by the general script or the one-rule one."""
    compiled = compile_tree(to_tree("user:1000/m"))
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    scripted = BY_ALGORITHM[algorithm]
    out = []
    for i in range(users):
        plan = cached_plan(compiled, namespace, "work", (f"user-{i}",), 1, algorithm)
        command = plan_command(plan)
        assert command.script is scripted.one
        script = scripted.script if general else command.script
        out.append(Command(script, command.keys, command.args, command.packed_args))
    return out


def server_us(client: redis.Redis, sent: list[Command], batched: bool) -> float:
    """Redis's EVALSHA time per decision for ``sent``, pipelined 512 calls at a time."""
    calls = sent
    if batched:
        calls = [batch_command(sent[i : i + BATCH_SIZE]) for i in range(0, len(sent), BATCH_SIZE)]
    client.config_resetstat()
    for start in range(0, len(calls), 512):
        pipe = client.pipeline(transaction=False)
        for c in calls[start : start + 512]:
            pipe.evalsha(c.script.sha.decode(), len(c.keys), *c.keys, *c.args)
        pipe.execute()
    stats = client.info("commandstats")["cmdstat_evalsha"]
    assert stats["calls"] == len(calls), stats
    return float(stats["usec"]) / len(sent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--users", type=int, default=5000)
    args = parser.parse_args()
    results: dict[tuple[str, bool, str, bool], list[float]] = {}
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.script_load(BATCH.source)
        for scripted in BY_ALGORITHM.values():
            for script in (scripted.script, scripted.one):
                if script is not None:
                    client.script_load(script.source)
        print(f"redis-server {server.version()}; user:1000/m, {args.users} users\n")
        for n in range(args.rounds):
            for algorithm in ALGORITHMS:
                for batched in (False, True):
                    # alternated, each on an empty server (a key space that grows past a
                    # power of two rehashes, which would land on one of them)
                    for general in (True, False) if n % 2 else (False, True):
                        sent = commands(algorithm, args.users, general)
                        client.flushall()
                        for users in ("new", "returning"):
                            key = (algorithm, batched, users, general)
                            results.setdefault(key, []).append(server_us(client, sent, batched))
        client.close()
    print("| algorithm | sent | users | general µs | one rule µs | one rule / general |")
    print("|---|---|---|---:|---:|---:|")
    for algorithm in ALGORITHMS:
        for batched in (False, True):
            for users in ("new", "returning"):
                base = statistics.median(results[(algorithm, batched, users, True)])
                one = statistics.median(results[(algorithm, batched, users, False)])
                sent_as = f"in batches of {BATCH_SIZE}" if batched else "alone"
                print(
                    f"| {algorithm} | {sent_as} | {users} | {base:.2f} | {one:.2f} | "
                    f"{one / base:.2f} |"
                )


if __name__ == "__main__":
    main()
