"""Plans that span hash tags, and the parts they are decided by.

Where a Redis store spreads (a cluster, or ``spread=True``), where an identifier's keys live
is a property of the identifier alone (:mod:`~ratelimit.backends.redis.keys`): one with a
selector under a hash tag of its own, ``{<namespace>:<key>:<selector>=<value>}``, one
without under its (namespace, key)'s, ``{<namespace>:<key>}``, whatever tree counts on it.
So one identifier has one counter whatever rules a process holds: two limits made at one
place with different rules, a rolling deploy of new rules, an override or rules chosen per
call all count on the same keys.

A call of a tree whose every rule names one selector (``user:5/m | user:100/h``) touches
one tag and is decided by one script, as always. Another tree's call (``user:3/h | 1000/h``:
the user's tag and the key's; ``apikey:100/h & (10/s | 15/m)``) spans tags, which a Redis
Cluster keeps in slots of their own, out of any one script's reach. :func:`spanning` splits
its plan into :class:`Part` s, one per tag, that the engine decides in turn (a standalone
server runs any keys in one script, and is never asked to):

- **a conjunction** (the root is an ``Or``: every child must admit): the children that
  count under one tag are grouped by it into parts, each decided as one plan, the value
  parts first and the key's own part last, each recording only when it admits; then each
  child whose own rules span tags (:class:`Nested`, ``user:2/m & ip:3/m`` in
  ``(user:2/m & ip:3/m) | 6/m``) by its pivot, as below. The first step to refuse refuses
  the call and what the steps before it recorded is refunded. Each identifier's count is
  read and written atomically with its own check, so no identifier admits past its rules,
  and only calls that passed every earlier step count on the later ones (the key's shared,
  busiest part among them), which keeps held hits off the parts most calls share.
- **otherwise** (an ``And`` at the root, across tags: a part that refuses may be
  outvoted; or an ``Or`` whose every child spans tags): the parts
  but one are *held* (recorded whatever they read), then the *pivot* (the key's own part,
  else the last) is recorded whatever it reads, atomically with its read; when its rules
  alone settle the tree, that is the verdict; else each held part is *checked* (read, at
  the time it was held, with the call's own hits in it). Refused, every part is refunded.
  Every call's writes precede its pivot and its checks follow it, so each call sees
  every call whose pivot came before its own: the calls admitted are those of a serial
  run in pivot order (a call may see more than that, and refuse where a serial run would
  admit: only while other calls are in flight near the limit).

Refunds are settles (``settle_*.lua``) of what each part recorded, at its part's time.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

from ratelimit.backends.naming import tag
from ratelimit.backends.redis.keys import spread_tag
from ratelimit.core.plan import OP_LEAF, OP_OR, PLANS, CompiledTree, Plan, cached_plan, compile_tree
from ratelimit.core.settling import Settlement
from ratelimit.rules.tree import MAX_COUNT, And, Node, Or, Rule

NEVER = Rule(MAX_COUNT, 1, "_never_")
"""A rule no call resolves (its selector is never given): never limited, it records nothing.
``And(rules, NEVER)`` is never limited, so its plan records the call whatever its rules
read: a part held."""


class PartPlans:
    """The plans of one part, each built at its first use (most calls read one or two):
    its rules as a subtree of the whole plan's, on the same identifiers."""

    __slots__ = ("_built", "_leaves", "_plan", "_tree")

    def __init__(self, plan: Plan, tree: Node, leaves: tuple[int, ...]) -> None:
        self._plan, self._tree, self._leaves = plan, tree, leaves
        self._built: dict[str, Plan] = {}

    def get(self, kind: str) -> Plan:
        built = self._built.get(kind)
        if built is None:
            plan, tree, leaves = self._plan, self._tree, self._leaves
            if kind == "held":
                built = _plan_of(plan, And(tree, NEVER), leaves, True)
            elif kind == "check":
                built = _plan_of(plan, tree, leaves, False, cost=0)
            else:
                built = _plan_of(plan, tree, leaves, kind == "decide")
            self._built[kind] = built
        return built


class Part(NamedTuple):
    """The rules of one plan that count under one hash tag, as plans of their own."""

    leaves: tuple[int, ...]
    """The whole plan's leaves this part decides, in the order of its plans' leaves."""
    plans: PartPlans
    key_wide: bool
    """Whether it is the (namespace, key)'s own tag (identifiers of no selector)."""
    tag: str
    """The hash tag its keys share."""

    @property
    def decide(self) -> Plan:
        """Its rules, recorded when they admit (a conjunction's part; what a settle of the
        call records on, and a reset forgets)."""
        return self.plans.get("decide")

    @property
    def peek(self) -> Plan:
        """Its rules, recording nothing."""
        return self.plans.get("peek")

    @property
    def held(self) -> Plan:
        """Its rules and :data:`NEVER` (the last leaf): recorded whatever they read."""
        return self.plans.get("held")

    @property
    def check(self) -> Plan:
        """Its rules at cost 0, recording nothing: read after the call's own hits were
        held, a rule is limited when they leave it over its count."""
        return self.plans.get("check")


class Nested(NamedTuple):
    """A child of a conjunction's root ``Or`` whose own identifiers span tags (``user:2/m &
    ip:3/m`` in ``(user:2/m & ip:3/m) | 6/m``), decided as a plan of its own by holds, a
    pivot and checks, after the conjunction's parts."""

    plan: Plan
    """The child's plan, on the whole plan's identifiers."""
    spanning: Spanning
    """How it is decided (its parts' leaves are the child plan's)."""
    leaves: tuple[int, ...]
    """Per leaf of the child plan, the whole plan's leaf."""


class Spanning(NamedTuple):
    """How a plan that spans tags is decided: its parts (the key's own last), whether the
    tree is a conjunction of them (see the module), and a conjunction's children that span
    tags themselves, decided after its parts."""

    parts: tuple[Part, ...]
    conjunction: bool
    nested: tuple[Nested, ...]
    every_part: tuple[Part, ...]
    """Every part the call counts on, its leaves the whole plan's (a settle, a reset and a
    peek go to each): the parts, then each nested child's."""


def tag_of(plan: Plan, leaf: int) -> str:
    """The hash tag leaf ``leaf``'s identifier keeps its keys under where keys spread."""
    identifier = plan.identifiers[plan.leaf_identifiers[leaf]]
    if identifier.selector is None:
        return tag(identifier.namespace, identifier.key)
    return spread_tag(identifier)


@functools.lru_cache(maxsize=PLANS)
def spanning(plan: Plan) -> Spanning | None:
    """The parts of ``plan`` on a store that spreads, or ``None`` when its call counts
    under one tag (or none: every selector unresolved), or its tree was compiled pinned."""
    compiled = plan.compiled
    if compiled.spreads or compiled.pinned or len(plan.identifiers) < 2:
        return None
    tags: dict[int, str] = {
        leaf: tag_of(plan, leaf) for leaf, k in enumerate(plan.leaf_identifiers) if k >= 0
    }
    if len(set(tags.values())) < 2:
        return None
    key_tag = tag(plan.namespace, plan.key)
    children = _root_children(compiled)
    by_tag: dict[str, list[tuple[Node, tuple[int, ...]]]] = {}
    nested: list[Nested] = []
    for node, leaves in children or ():
        named = {tags[leaf] for leaf in leaves if leaf in tags}
        if len(named) > 1:
            child = _plan_of(plan, node, leaves, True)
            inner = spanning(child)
            assert inner is not None  # its identifiers span tags
            nested.append(Nested(child, inner, leaves))
        elif named:
            by_tag.setdefault(named.pop(), []).append((node, leaves))
    conjunction = children is not None and bool(by_tag)
    if not conjunction:  # not an Or, or each child spans tags: one pivot for the tree
        by_tag, nested = {}, []
        for leaf, name in tags.items():
            by_tag.setdefault(name, []).append((compiled.rules[leaf], (leaf,)))
    order = sorted(by_tag, key=lambda name: (name == key_tag, name))  # the key's own last
    parts = tuple(_part(plan, by_tag[name], name == key_tag, name) for name in order)
    every = parts + tuple(
        part._replace(leaves=tuple(nest.leaves[j] for j in part.leaves))
        for nest in nested
        for part in nest.spanning.parts
    )
    return Spanning(parts, conjunction, tuple(nested), every)


def _root_children(compiled: CompiledTree) -> list[tuple[Node, tuple[int, ...]]] | None:
    """The root ``Or``'s children with the leaves each holds, or ``None`` when the root
    is not an ``Or``."""
    program = compiled.program
    if program[0] != OP_OR:
        return None
    children: list[tuple[Node, tuple[int, ...]]] = []
    pos = 2
    assert isinstance(compiled.tree, Or)
    for child in compiled.tree.children:
        leaves, pos = _leaves(program, pos)
        children.append((child, leaves))
    return children


def _leaves(program: Sequence[int], pos: int) -> tuple[tuple[int, ...], int]:
    """The leaves of the subtree at ``pos`` of a prefix program, and where it ends."""
    op, operand = program[pos], program[pos + 1]
    pos += 2
    if op == OP_LEAF:
        return (operand,), pos
    leaves: tuple[int, ...] = ()
    for _ in range(operand):
        more, pos = _leaves(program, pos)
        leaves += more
    return leaves, pos


def _part(plan: Plan, nodes: list[tuple[Node, tuple[int, ...]]], key_wide: bool, name: str) -> Part:
    leaves = tuple(leaf for _, found in nodes for leaf in found)
    tree = nodes[0][0] if len(nodes) == 1 else Or(*(node for node, _ in nodes))
    return Part(leaves, PartPlans(plan, tree, leaves), key_wide, name)


def _plan_of(
    plan: Plan,
    tree: Node,
    leaves: tuple[int, ...],
    record: bool,
    cost: float | None = None,
) -> Plan:
    """The plan of ``tree`` (whose leaves are ``plan``'s ``leaves`` in order, then maybe
    :data:`NEVER`) on the same identifiers as ``plan``'s."""
    compiled = compile_tree(tree)
    value_of: dict[str, str | None] = {}
    for leaf in leaves:
        selector = plan.compiled.rules[leaf].selector
        k = plan.leaf_identifiers[leaf]
        if selector is not None:
            value_of[selector] = None if k < 0 else plan.identifiers[k].value
    values = tuple(value_of.get(name) for name in compiled.selectors)
    costs = [plan.leaf_cost(leaf) for leaf in leaves]
    costs += [max(costs)] * (len(compiled.rules) - len(costs))  # NEVER's, which counts nowhere
    spent: float | tuple[float, ...] = cost if cost is not None else tuple(costs)
    return cached_plan(compiled, plan.namespace, plan.key, values, spent, plan.algorithm, record)


def settled_by_parts(settled: Settlement, spanning: Spanning) -> list[Settlement]:
    """A settle of a call decided by parts, as one settle per part that has anything to
    record, each on its part's plan at the time its part was decided."""
    out = []
    for part in spanning.every_part:
        deltas = tuple(settled.deltas[leaf] for leaf in part.leaves)
        if not any(deltas):
            continue
        held = tuple(settled.held[leaf] for leaf in part.leaves) if settled.held else ()
        at = settled.times[part.leaves[0]] if settled.times else settled.at_us
        out.append(Settlement(part.decide, at, deltas, held))
    return out


def three_valued(compiled: CompiledTree, limited: dict[int, bool]) -> bool | None:
    """Whether ``compiled`` is limited given some leaves' flags (``limited``), whatever the
    others say; ``None`` when that depends on them."""

    def node(pos: int) -> tuple[bool | None, int]:
        op, operand = compiled.program[pos], compiled.program[pos + 1]
        pos += 2
        if op == OP_LEAF:
            return limited.get(operand), pos
        flags = []
        for _ in range(operand):
            flag, pos = node(pos)
            flags.append(flag)
        if op == OP_OR:  # limited when any child is
            if True in flags:
                return True, pos
            return (False if None not in flags else None), pos
        if False in flags:  # And: limited only when every child is
            return False, pos
        return (True if None not in flags else None), pos

    return node(0)[0]
