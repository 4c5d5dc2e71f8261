"""The script engine's decisions: the script's verdict stands, and the rest of the decision is
read from the counts it answered as :func:`~ratelimit.core.evaluation.evaluate` reads them.

The scripts and the Python evaluator are twins held together by ``tests/test_differential.py``;
here, what the engine makes of a reply (Redis replaced by canned replies), and the pipeline's
queue that decisions await directly.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence

import pytest
import redis.asyncio as aioredis

from ratelimit import RedisScriptBackend
from ratelimit.backends.redis.resp import Command, Script, pack, pack_args
from ratelimit.backends.redis.script.batch import BATCH, combine, split
from ratelimit.backends.redis.script.pipeline import Pipeline, Reply
from ratelimit.core.evaluation import evaluate, stored_verdict
from ratelimit.core.plan import Plan, cached_plan, compile_tree
from ratelimit.rules.tree import to_tree

NOW_US = 1_700_000_000_000_000
SPAN_US = 60_000_000


def log_plan(rules: str, values: tuple[str | None, ...] = ("u",), cost: float = 1) -> Plan:
    return cached_plan(
        compile_tree(to_tree(rules)), "verdict", "work", values, cost, "sliding-log", True
    )


def test_the_verdict_reads_the_counts_as_evaluate_does() -> None:
    """Wherever the store and the evaluator agree (they do: the differential suite), the
    decision is evaluate's, field by field and state by state."""
    rng = random.Random(36)
    plans = [
        log_plan("user:5/m"),
        log_plan("user:5/m", cost=2),
        log_plan("user:5/m", (None,)),
        log_plan("user:5/m | 20/h"),
        log_plan("user:5/m & user:3/s"),
        log_plan("user:5/m | 20/h", (None,)),
    ]
    for _ in range(400):
        plan = rng.choice(plans)
        counts = [
            (rng.randint(0, rule.count), NOW_US - rng.randint(0, SPAN_US - 1))
            for rule in plan.compiled.rules
        ]
        expected = evaluate(plan, NOW_US, counts)
        got = stored_verdict(plan, expected.allowed, NOW_US, counts)
        assert got == expected
        assert got.states == expected.states
        assert (got._reservation is None) == (expected._reservation is None)


class CannedReplies:
    """The pipeline's exchange with Redis, answering every script call with ``reply``."""

    def __init__(self, reply: list[int]) -> None:
        self.reply = reply
        self.sent: list[Command] = []

    async def __call__(self, commands: list[Command]) -> list[Reply | Exception]:
        await asyncio.sleep(0)
        self.sent += commands
        return [
            [self.reply] * (len(c.args[0].split()) // 3) if c.script is BATCH else self.reply
            for c in commands
        ]


def canned(backend: RedisScriptBackend, reply: list[int]) -> CannedReplies:
    exchange = CannedReplies(reply)
    backend._pipeline._exchange = exchange  # type: ignore[method-assign]
    return exchange


async def test_the_scripts_verdict_stands_where_the_counts_read_otherwise() -> None:
    """The script admitted (and recorded) a call whose counts, read in Python, say limited:
    the decision says what the store did, with nothing left, instead of a BackendError
    (the old engine decided again and raised when the two disagreed)."""
    backend = RedisScriptBackend(aioredis.Redis(), timeout=None)
    plan = log_plan("user:3/m")
    canned(backend, [1, NOW_US, 3, NOW_US - 1000])  # 3 hits of 3 inside the window
    decision = await backend.decide(plan)
    assert decision.allowed
    assert decision.retry_after == 0.0
    assert decision.remaining == 0
    assert decision.rule == plan.compiled.rules[0]

    canned(backend, [0, NOW_US, 0, 0])  # refused, with nothing counted
    refused = await backend.decide(plan)
    assert not refused.allowed
    assert refused.retry_after == 0.0
    assert refused.remaining == 0
    await backend.aclose()


async def test_an_admission_reads_remaining_from_the_scripts_counts() -> None:
    backend = RedisScriptBackend(aioredis.Redis(), timeout=None)
    plan = log_plan("user:3/m")
    canned(backend, [1, NOW_US, 1, NOW_US - 1000])
    decision = await backend.decide(plan)
    assert (decision.allowed, decision.remaining) == (True, 1)
    assert decision == evaluate(plan, NOW_US, [(1, NOW_US - 1000)])
    canned(backend, [0, NOW_US, 3, NOW_US - 1000])
    refused = await backend.decide(plan)
    assert not refused.allowed
    assert refused.retry_after == pytest.approx((SPAN_US - 1000) / 1e6)
    await backend.aclose()


@pytest.mark.parametrize(
    "reply",
    [[1, NOW_US, 1], [2, NOW_US, 1, 0], [1, NOW_US, 1, 0, 5, 0], b"OK", [1, b"x", 1, 0]],
)
async def test_a_reply_of_another_shape_is_not_a_reply(reply: Sequence[object]) -> None:
    backend = RedisScriptBackend(aioredis.Redis(), timeout=None)
    canned(backend, reply)  # type: ignore[arg-type]
    with pytest.raises(Exception, match="not a reply of Redis"):
        await backend.decide(log_plan("user:3/m"))
    await backend.aclose()


async def test_calls_made_together_are_queued_and_awaited_directly() -> None:
    """The first call goes alone; the calls made while it is out are queued (their futures
    are what the engine awaits) and go together, as one call of the batch script."""
    backend = RedisScriptBackend(aioredis.Redis(), timeout=None)
    exchange = canned(backend, [1, NOW_US, 0, 0])
    plans = [log_plan("user:3/m", (f"u{n}",)) for n in range(5)]
    decisions = await asyncio.gather(*(backend.decide(p) for p in plans))
    assert all(d.allowed for d in decisions)
    assert [c.script is BATCH for c in exchange.sent] == [False, True]
    assert backend.calls_per_script == {1: 1, 4: 1}
    await backend.aclose()


async def test_queued_waits_only_behind_calls_in_flight() -> None:
    pipeline = Pipeline(None)
    command = Command(Script("return 1"), ["k"], [b"a"], pack_args([b"a"]))
    assert pipeline.queued(command, "k") is None  # not bound to this loop yet
    await pipeline.bind()
    assert pipeline.queued(command, "k") is None  # nothing in flight: it goes alone
    pipeline._in_flight = 1
    future = pipeline.queued(command, "k")
    assert future is not None
    assert pipeline._pending == [(command, "k", future)]
    future.cancel()
    pipeline._pending.clear()
    pipeline._in_flight = 0
    await asyncio.sleep(0)  # the flush it scheduled finds nothing


def test_a_command_packs_whole_when_sent_alone_and_a_batch_splits_in_order() -> None:
    script = Script("return 1")
    commands = [
        Command(script, [f"k{n}", "é"], [b"a", b"bb"], pack_args([b"a", b"bb"])) for n in range(3)
    ]
    for c in commands:  # a key of another alphabet is packed as UTF-8 all the same
        assert c.packed == pack(
            b"EVALSHA", script.sha, b"2", *(k.encode() for k in c.keys), *c.args
        )
    assert combine(commands, by_slot=False) == (commands, None)  # not batchable
    replies = [[1], [2], [3]]
    assert split([replies], [[0, 1, 2]]) == replies


async def test_a_disagreement_of_store_and_evaluator_is_logged_once_per_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 46: a store's verdict that its own counts contradict is a bug in one twin. The
    store's verdict stands, and the disagreement is logged (once per limit) with both
    answers, never passed over quietly as "nothing left"."""
    backend = RedisScriptBackend(aioredis.Redis(), timeout=None)
    tree = compile_tree(to_tree("user:3/m"))
    plan = cached_plan(tree, "loud", "work", ("u",), 1, "sliding-log", True)
    other = cached_plan(tree, "loud", "other", ("u",), 1, "sliding-log", True)
    with caplog.at_level(logging.ERROR, logger="ratelimit"):
        canned(backend, [1, NOW_US, 3, NOW_US - 1000])  # admitted; 3 hits of 3 say refuse
        assert (await backend.decide(plan)).allowed
        assert (await backend.decide(plan)).allowed
        canned(backend, [0, NOW_US, 0, 0])  # refused; nothing counted says admit
        assert not (await backend.decide(other)).allowed
    logged = [r.getMessage() for r in caplog.records if "disagree" in r.getMessage()]
    assert len(logged) == 2, logged  # once for each limit
    assert "admitted a call of key 'work'" in logged[0]
    assert "say to refuse" in logged[0]
    assert "user:3/m" in logged[0]
    assert "refused a call of key 'other'" in logged[1]
    await backend.aclose()
