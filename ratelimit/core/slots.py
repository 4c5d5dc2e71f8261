"""Concurrency slots as data: what ``rl.concurrency("user:5")`` limits, and one claim on them.

A slot limit is ``[selector:]count``: at most ``count`` bodies run at once per value of the
selector (``"5"``: per key). Several limits all apply: ``"user:5 | 100"`` holds a slot of
each, taken together or not at all. A :class:`SlotClaim` is one acquisition: its
identifiers, their counts, a token naming the holder and the lease after which a holder
that stopped renewing loses its slots. Storage keeps, per identifier, its holders' tokens
and when their leases end. Pure data, as :mod:`ratelimit.core.plan` is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ratelimit.core.plan import Identifier
from ratelimit.errors import RuleSyntaxError
from ratelimit.rules.tree import MAX_COUNT

_PART = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)\s*:\s*)?(\d+)\s*")
_SEPARATORS = "|,;"


@dataclass(frozen=True, slots=True)
class SlotLimit:
    """At most ``count`` bodies at once, per value of ``selector`` if one is named."""

    count: int
    selector: str | None = None

    def __str__(self) -> str:
        return f"{self.selector}:{self.count}" if self.selector else str(self.count)


def parse_slots(text: str) -> tuple[SlotLimit, ...]:
    """``"user:5"``, ``"5"`` or several that all apply: ``"user:5 | 100"``."""
    if not isinstance(text, str):
        raise TypeError(f"a concurrency limit is text such as 'user:5', not {type(text).__name__}")
    limits: list[SlotLimit] = []
    position = 0
    for part in re.split(rf"[{re.escape(_SEPARATORS)}]", text):
        match = _PART.fullmatch(part)
        if match is None:
            column = position + len(part) - len(part.lstrip()) + 1
            hint = (
                "; a span ('/s') belongs to rate rules (limit()), slots are held, not counted "
                "per span"
                if "/" in part
                else ""
            )
            raise RuleSyntaxError(
                f"a concurrency limit is [selector:]count, such as 'user:5' or '5'{hint}",
                text,
                column,
            )
        count = int(match[2])
        if not 1 <= count <= MAX_COUNT:
            raise RuleSyntaxError(
                f"count must be an integer from 1 to {MAX_COUNT}, not {match[2]}",
                text,
                position + match.start(2) + 1,
            )
        limits.append(SlotLimit(count, match[1]))
        position += len(part) + 1
    return tuple(limits)


@dataclass(frozen=True, slots=True)
class SlotClaim:
    """One acquisition: a slot on each of ``identifiers`` (at most ``counts[i]`` holders
    on identifier ``i``), held by ``token`` for ``lease_us`` microseconds at a time."""

    namespace: str
    key: str
    identifiers: tuple[Identifier, ...]
    counts: tuple[int, ...]
    token: str
    lease_us: int
    spreads: bool = True
    """Whether a store that spreads keeps each identifier's slots under its own hash tag
    (its own (namespace, key, selector, value): the layout is the identifier's, whatever
    limits a process holds, so one identifier never has two slot sets). A claim whose
    identifiers lie in several slots of a Redis Cluster is taken part by part."""


def claim_for(
    limits: tuple[SlotLimit, ...],
    namespace: str,
    key: str,
    values: dict[str, str | None],
    token: str,
    lease_us: int,
) -> SlotClaim:
    """The claim of one call: a limit whose selector resolved to ``None`` or ``""`` does
    not apply; two limits on one identifier hold one slot, under the smaller count."""
    counts: dict[Identifier, int] = {}
    for limit in limits:
        value = None if limit.selector is None else values.get(limit.selector)
        if limit.selector is not None and not value:
            continue
        identifier = Identifier(namespace, key, limit.selector, value)
        counts[identifier] = min(counts.get(identifier, limit.count), limit.count)
    return SlotClaim(namespace, key, tuple(counts), tuple(counts.values()), token, lease_us)
