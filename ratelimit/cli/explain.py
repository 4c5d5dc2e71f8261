"""What a rule tree means, in words: ``ratelimit check`` prints it for each tree it checks.

A tree's ``&`` refuses a call only when every side would refuse it (``And``), its ``|``
when any side would (``Or``); users of ``limits``, where every listed limit applies, read
``&`` the other way, so the words say "only when both". ``"apikey:100/h & (10/s | 15/m)"``
reads::

    refused only when both: more than 100 calls per hour for one apikey, and (more than 10
    per second or more than 15 per minute, every call of the key)

A rule with a selector counts per value of it ("for one apikey"); one without counts every
call of the key together ("for the whole key"). A group whose rules all count calls the same
way says so once, at its end. ``per=`` names what a rule without a selector counts per
instead (the service's rules file counts per descriptor).

:func:`placement` says where a tree's counters live on a Redis Cluster (a store that
spreads, :attr:`~ratelimit.core.plan.CompiledTree.spreads`): ``"user:5/m | user:100/h"`` reads
``on a Redis Cluster: spread by user (each user's counters in a slot of their own)``, and
``"apikey:100/h & 10/s"`` ``on a Redis Cluster: each apikey's counters in a slot of their
own, the whole key's in the key's own: a call spans 2 slots, decided by parts``.
"""

from __future__ import annotations

from ratelimit.core.plan import compile_tree
from ratelimit.rules.tree import And, Node, Rule

__all__ = ["describe", "placement"]

_UNITS = (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000), ("second", 1_000))


def describe(node: Node, per: str | None = None) -> str:
    """One sentence saying when ``node`` refuses a call. ``per``: what a rule without a
    selector counts per (``"descriptor [remote_address]"``); ``None``, the whole key."""
    node = _single(node)
    if isinstance(node, Rule):
        return f"refused when: {_condition(node, per)}"
    parts = [_condition(child, per) for child in node.children]
    if isinstance(node, And):
        head, word = ("both", "and") if len(parts) == 2 else ("all of", "and")
        head = f"refused only when {head}"
    else:
        head, word = ("either", "or") if len(parts) == 2 else ("any of", "or")
        head = f"refused when {head}"
    return f"{head}: {', '.join(parts[:-1])}, {word} {parts[-1]}"


def placement(node: Node) -> str:
    """Where ``node``'s counters live on a Redis Cluster: each identifier with a selector
    in a slot of its own, those of no selector in the key's (a limit's layout is its
    identifiers', whatever the tree); a call whose identifiers lie in several slots is
    decided by parts (:mod:`ratelimit.backends.redis.spanning`). The service's limits and
    ``spread=False`` keep one slot per key whatever the tree."""
    compiled = compile_tree(node)
    if compiled.spreads:
        name = compiled.selectors[0]
        return (
            f"on a Redis Cluster: spread by {name} (each {name}'s counters in a slot of their own)"
        )
    names = list(dict.fromkeys(s.partition("#")[0] for s in compiled.selectors))
    whole = any(rule.selector is None for rule in compiled.rules)
    if not names:
        return "on a Redis Cluster: one slot for the whole key (no rule names a selector)"
    each = [f"each {name}'s" for name in names]
    owners = each[0] if len(each) == 1 else f"{', '.join(each[:-1])} and {each[-1]}"
    slots = len(compiled.selectors) + whole
    key = ", the whole key's in the key's own" if whole else ""
    return (
        f"on a Redis Cluster: {owners} counters in a slot of their own{key}: a call spans "
        f"{slots} slots, decided by parts"
    )


def span(ms: int) -> str:
    """A span in words: ``"second"``, ``"5 minutes"``, ``"1500 ms"``."""
    for unit, size in _UNITS:
        if ms % size == 0:
            n = ms // size
            return unit if n == 1 else f"{n} {unit}s"
    return f"{ms} ms"


def _single(node: Node) -> Node:
    """``node``, or its only child for an ``And``/``Or`` of one (which means that child)."""
    while not isinstance(node, Rule) and len(node.children) == 1:
        node = node.children[0]
    return node


def _condition(node: Node, per: str | None) -> str:
    """When ``node`` alone is limited; a group in parentheses."""
    node = _single(node)
    if isinstance(node, Rule):
        return f"{_amount(node, node.unit or 'calls')} {_scope(node.selector, per)}"
    children = [_single(child) for child in node.children]
    word = " and " if isinstance(node, And) else " or "
    shared = _shared_scope(node)
    if shared is None:
        return f"({word.join(_condition(child, per) for child in children)})"
    leaves = word.join(_bare(child) for child in children)
    return f"({leaves}, every call of {_noun(shared[0], per)})"


def _bare(node: Node) -> str:
    """``node`` without what it counts or per what (its group says it once)."""
    node = _single(node)
    if isinstance(node, Rule):
        return _amount(node, None)
    word = " and " if isinstance(node, And) else " or "
    return f"({word.join(_bare(child) for child in node.children)})"


def _amount(rule: Rule, what: str | None) -> str:
    if what == "calls" and rule.count == 1:
        what = "call"
    counted = f"{rule.count} {what}" if what else str(rule.count)
    burst = "" if rule.burst is None else f" (sustained; up to {rule.burst} at once)"
    return f"more than {counted} per {span(rule.span_ms)}{burst}"


def _scope(selector: str | None, per: str | None) -> str:
    if selector is None and per is None:
        return "for the whole key"
    return f"for {_noun(selector, per)}"


def _noun(selector: str | None, per: str | None) -> str:
    if selector is not None:
        return f"one {selector}"
    return "the key" if per is None else f"one {per}"


def _shared_scope(node: Node) -> tuple[str | None] | None:
    """The selector every rule under ``node`` counts calls per, when they all count calls
    (no unit) per the same one (``(None,)``: the whole key); else ``None``."""
    rules = _rules(node)
    selectors = {rule.selector for rule in rules}
    if len(selectors) != 1 or any(rule.unit is not None for rule in rules):
        return None
    return (selectors.pop(),)


def _rules(node: Node) -> list[Rule]:
    if isinstance(node, Rule):
        return [node]
    return [rule for child in node.children for rule in _rules(child)]
