"""Reading the Redis decision scripts' replies: a decision's verdict, time and counts
(:func:`read_reply`), and a ``sync_rate`` sync's totals (:func:`synced`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ratelimit.backends.base import Totals
from ratelimit.backends.redis.script.scripts import BY_ALGORITHM
from ratelimit.core.plan import Plan


def read_reply(plan: Plan, reply: Any) -> tuple[bool, int, Sequence[tuple[float, float]]]:
    """The verdict, the time (us) and per rule its two counts in a decision script's
    ``reply`` to ``plan``; one of :data:`~.errors.NOT_A_REPLY` when it is not a reply of
    that shape."""
    allowed = reply[0]
    now_us = int(reply[1])
    number = int if BY_ALGORITHM[plan.algorithm.name].whole else float
    if len(reply) == 4:  # one rule
        counts: Sequence[tuple[float, float]] = ((number(reply[2]), number(reply[3])),)
    else:
        numbers = [number(n) for n in reply[2:]]
        counts = list(zip(numbers[0::2], numbers[1::2], strict=True))
    if allowed not in (0, 1) or len(counts) != len(plan.compiled.rules):
        raise ValueError(f"{reply!r:.80}")
    return allowed == 1, now_us, counts


def synced(reply: list[bytes]) -> Totals:
    """The totals in a reply of ``counter_sync.lua``: per window size, its windows' counts."""
    by_size: Totals = {}
    for n in range(1, len(reply), 5):
        windows = by_size.setdefault(int(reply[n]), {})
        for index, count in ((reply[n + 1], reply[n + 2]), (reply[n + 3], reply[n + 4])):
            if int(index) >= 0:
                windows[int(index)] = float(count)
    return by_size
