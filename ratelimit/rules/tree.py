"""Rule trees: :class:`Rule` leaves combined with :class:`And` and :class:`Or`. Pure data.

``Or(a, b)`` is limited when any child is limited; ``And(a, b)`` only when every child is.
``str()`` of a tree is rule text that parses back to an equal tree::

    >>> str(And("apikey:100/h", Or("10/s", "15/m")))
    'apikey:100/h & (10/s | 15/m)'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from ratelimit.errors import RuleSyntaxError

MAX_COUNT = 1_000_000_000
MAX_SPAN_MS = 3650 * 86_400_000  # ten years

# Largest first, so that a span is written in the largest unit that divides it.
UNIT_MS: tuple[tuple[str, int], ...] = (
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
)

_SELECTOR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:#[1-9][0-9]*)?\Z")
MAX_UNIT = 32
_UNIT = re.compile(rf"[A-Za-z_][A-Za-z0-9_]{{0,{MAX_UNIT - 1}}}\Z")
NOT_UNITS = frozenset({"r", "per", "burst"})
"""Words that cannot name a unit: ``10r/s`` counts calls, ``per`` and ``burst`` are syntax."""


@dataclass(frozen=True, slots=True)
class Rule:
    """``count`` calls per ``span_ms`` milliseconds, per value of ``selector`` if one is named.

    Usually written as text: ``Rule.parse("username:10/5m") == Rule(10, 300_000, "username")``.
    ``burst`` (``algorithm="gcra"`` only; written ``"10/s burst 20"``) is how many calls may
    come at once; ``None`` means ``count``.

    ``unit`` names what the rule counts (written ``"apikey:90000 tokens/m"``): such a rule
    counts the amount a call's ``cost`` mapping gives for its unit (``{"tokens": 1200}``)
    on a counter of its own; ``None`` counts calls (or the cost, when it is a number).

    A selector is an identifier, optionally followed by ``#n`` (``user#1``): another
    occurrence of ``user`` in one tree, with a value of its own, counted on the same
    counters as ``user`` (see :func:`~ratelimit.core.plan.cached_plan`). The grammar never writes
    it; the rate-limit service does, for one limit named by several descriptors of a request.
    """

    count: int
    span_ms: int
    selector: str | None = None
    burst: int | None = None
    unit: str | None = None

    def __post_init__(self) -> None:
        if type(self.count) is not int or not 1 <= self.count <= MAX_COUNT:
            raise RuleSyntaxError(
                f"count must be an integer from 1 to {MAX_COUNT}, not {self.count!r}"
            )
        if type(self.span_ms) is not int or not 1 <= self.span_ms <= MAX_SPAN_MS:
            raise RuleSyntaxError(f"span must be from 1 ms to 3650 days, not {self.span_ms!r} ms")
        if self.selector is not None and not _SELECTOR.match(self.selector):
            raise RuleSyntaxError(
                f"selector must be an identifier (letters, digits, _), not {self.selector!r}"
            )
        if self.burst is not None and (
            type(self.burst) is not int or not 1 <= self.burst <= MAX_COUNT
        ):
            raise RuleSyntaxError(
                f"burst must be an integer from 1 to {MAX_COUNT}, not {self.burst!r}"
            )

        if self.unit is not None and (
            not isinstance(self.unit, str)
            or not _UNIT.match(self.unit)
            or self.unit.lower() in NOT_UNITS
        ):
            raise RuleSyntaxError(
                f"unit must be a word of letters, digits and _ (at most {MAX_UNIT} "
                f"characters, not 'r' or 'per'), not {self.unit!r}"
            )

    @classmethod
    def parse(cls, text: str) -> Rule:
        """Parse one rule such as ``"10/s"`` or ``"username:10/5m"``."""
        from ratelimit.rules.grammar import parse_rule

        return parse_rule(text)

    @property
    def span(self) -> float:
        """The span in seconds."""
        return self.span_ms / 1000

    def __str__(self) -> str:
        for unit, ms in UNIT_MS:
            if self.span_ms % ms == 0:
                multiple = self.span_ms // ms
                span = unit if multiple == 1 else f"{multiple}{unit}"
                break
        prefix = f"{self.selector}:" if self.selector else ""
        unit = "" if self.unit is None else f" {self.unit}"
        suffix = "" if self.burst is None else f" burst {self.burst}"
        return f"{prefix}{self.count}{unit}/{span}{suffix}"


class _Composite:
    """``And`` / ``Or``: an operator over one or more child trees (rules or text)."""

    __slots__ = ("children",)
    operator: str = ""

    children: tuple[Node, ...]

    def __init__(self, *children: Node | str) -> None:
        if not children:
            raise RuleSyntaxError(f"{type(self).__name__}() needs at least one rule")
        self.children = tuple(to_tree(child) for child in children)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Composite)
            and type(self) is type(other)
            and (self.children == other.children)
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.children))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(str(c)) for c in self.children)})"

    def __str__(self) -> str:
        if len(self.children) == 1:
            return str(self.children[0])
        parts = (f"({c})" if isinstance(c, _Composite) else str(c) for c in self.children)
        return f" {self.operator} ".join(parts)


class And(_Composite):
    """Limited only when every child is limited: a quota with a burst allowance, say.
    Children are rule texts, :class:`Rule` objects or other trees.

    Example: ``And("apikey:100/h", Or("10/s", "15/m"))``, which the text
    ``"apikey:100/h & (10/s | 15/m)"`` also writes, refuses a key only once it has 100
    calls in the hour and 10 in the second or 15 in the minute."""

    __slots__ = ()
    operator = "&"


class Or(_Composite):
    """Limited when any child is limited: several limits that all apply. Children are
    rule texts, :class:`Rule` objects or other trees.

    Example: ``Or("10/s", "15/m")``, the text ``"10/s | 15/m"``, or ``limits``' own
    ``"10/second;15/minute"``."""

    __slots__ = ()
    operator = "|"


Node: TypeAlias = Rule | And | Or
RuleLike: TypeAlias = "Node | str | list[Node | str] | tuple[Node | str, ...]"


def map_rules(node: Node, change: Callable[[Rule], Rule]) -> Node:
    """``node`` with each rule replaced by ``change(rule)``, its And/Or shape kept."""
    if isinstance(node, Rule):
        return change(node)
    return type(node)(*(map_rules(child, change) for child in node.children))


def to_tree(rules: RuleLike) -> Node:
    """Turn what ``limit()`` accepts into a tree: text, a tree, or a list/tuple meaning ``Or``."""
    if isinstance(rules, Rule | And | Or):
        return rules
    if isinstance(rules, str):
        from ratelimit.rules.grammar import parse_tree

        return parse_tree(rules)
    if isinstance(rules, list | tuple):
        if len(rules) == 1:
            return to_tree(rules[0])
        return Or(*rules)
    raise TypeError(
        f"rules must be text such as '10/s', a Rule, And, Or, or a list of them; "
        f"got {type(rules).__name__}"
    )
