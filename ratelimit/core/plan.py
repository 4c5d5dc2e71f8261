"""Plans: what a backend must decide for one call.

A rule tree is compiled once (:class:`CompiledTree`): its leaves in order and a prefix
program of opcodes that storage scripts evaluate. Each call then gets a :class:`Plan`: the
identifier each leaf counts on, after its selector was resolved, and what the call counts
on each. Backends count hits per leaf and hand them to :mod:`ratelimit.core.evaluation`,
which turns counts (and a store's verdict) into a decision.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from typing import NamedTuple

from ratelimit.algorithms import BY_NAME, SLIDING_LOG, US_PER_MS, Algorithm, named
from ratelimit.rules.tree import And, Node, Rule

# Prefix program opcodes, each followed by one operand.
OP_LEAF = 0  # operand: leaf index
OP_AND = 1  # operand: number of children
OP_OR = 2  # operand: number of children


class Identifier(NamedTuple):
    """What one hit is counted on: (namespace, key, selector name, selector value, unit).

    The selector name is the rule's without an occurrence suffix: ``user#1`` (another
    occurrence of ``user`` in one tree, see :class:`~ratelimit.rules.tree.Rule`) counts on
    ``user``'s identifiers, so that where a selector sits in a tree never changes its counter.
    ``unit``: what the rule counts (``tokens``), ``None`` for calls; a unit's counters are
    apart from the calls' (``apikey:60/m | apikey:90000 tokens/m`` counts twice per key).

    A named tuple: backends key their tables by it, and a tuple hashes and compares in C."""

    namespace: str
    key: str
    selector: str | None
    value: str | None
    unit: str | None = None


class CompiledTree:
    """A rule tree flattened for evaluation: leaves in order and a prefix program (which
    storage code may encode for its own scripts). Use :func:`compile_tree` to get the shared,
    cached instance for a tree.

    ``spreads``: whether every rule names one and the same selector (``user:5/m |
    user:100/h``), so that one call counts on the identifiers of one value only: where a
    store keeps each identifier with a selector apart from the others (a store of many
    nodes: where an identifier lives is a property of the identifier, never of the tree, so
    that one identifier has one counter whatever rules a process holds), such a call
    touches one place. Another tree's call spans the places of its identifiers
    (``user:3/h | 1000/h``: the user's and the key's) and the store decides it by parts.
    ``pinned``: compiled for a key declared to keep every identifier in one place (the
    rate-limit service's domains, whose every tree is compiled so): then nothing spreads.
    """

    __slots__ = ("pinned", "program", "rules", "selectors", "spreads", "tree")

    def __init__(self, tree: Node, pinned: bool = False) -> None:
        self.tree = tree
        rules: list[Rule] = []
        program: list[int] = []
        self._emit(tree, rules, program)
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.program: tuple[int, ...] = tuple(program)
        self.selectors: tuple[str, ...] = tuple(
            dict.fromkeys(r.selector for r in rules if r.selector is not None)
        )
        spreads = (
            len(self.selectors) == 1
            and "#" not in self.selectors[0]
            and all(r.selector is not None for r in rules)
        )
        self.pinned: bool = pinned
        """Compiled for a key that keeps every identifier in one slot (nothing spreads)."""
        self.spreads: bool = spreads and not pinned

    @classmethod
    def _emit(cls, node: Node, rules: list[Rule], program: list[int]) -> None:
        if isinstance(node, Rule):
            program += (OP_LEAF, len(rules))
            rules.append(node)
            return
        program += (OP_AND if isinstance(node, And) else OP_OR, len(node.children))
        for child in node.children:
            cls._emit(child, rules, program)

    def __repr__(self) -> str:
        pinned = ", pinned=True" if self.pinned else ""
        return f"CompiledTree({str(self.tree)!r}{pinned})"


_compiled = functools.lru_cache(maxsize=4096)(CompiledTree)


def compile_tree(tree: Node, pinned: bool = False) -> CompiledTree:
    """The compiled form of ``tree``, shared by every limit with an equal tree (one instance
    per tree and ``pinned``: see :attr:`CompiledTree.spreads`)."""
    return _compiled(tree, bool(pinned))


@dataclass(frozen=True, slots=True, eq=False)  # eq=False: hashed by identity, cheaply
class Plan:
    """One call's work: the compiled tree and, per leaf, the identifier it counts on.

    Shared by every call with the same selector values (:func:`cached_plan`), and immutable:
    a backend that builds something once per plan keeps it in a cache of its own, keyed by
    the plan (plans hash by identity).

    ``leaf_identifiers[i]`` indexes ``identifiers``, or is ``-1`` when leaf ``i``'s selector
    resolved to ``None`` or ``""`` (the rule is then never limited and records nothing).
    ``cost`` is how many hits the call is worth (at most every rule's count; whole for the
    sliding log), on every identifier alike; or, when ``costs`` is not empty, ``costs[k]``
    is what identifier ``k`` counts (a call whose rules count different amounts, such as
    the service's descriptors with their own ``hits_addend``, decided in one step).
    ``algorithm`` decides (:class:`~ratelimit.algorithms.Algorithm`).
    """

    compiled: CompiledTree
    namespace: str
    key: str
    identifiers: tuple[Identifier, ...]
    leaf_identifiers: tuple[int, ...]
    cost: float = 1
    algorithm: Algorithm = BY_NAME[SLIDING_LOG]
    windows: tuple[tuple[int, ...], ...] = ()
    """Window counters: per identifier, the window sizes (us) of the rules counting on it."""
    leaf_windows: tuple[int, ...] = ()
    """Window counters: per leaf, the position of its size in its identifier's ``windows``."""
    record: bool = True
    """Whether an allowed call is recorded; ``False`` only decides (``Limit.peek``)."""
    costs: tuple[float, ...] = ()
    """Per identifier, what the call counts on it; empty when every identifier counts
    ``cost``."""

    def identifier_cost(self, k: int) -> float:
        """What the call counts on identifier ``k``."""
        return self.costs[k] if self.costs else self.cost

    def leaf_cost(self, leaf: int) -> float:
        """What the call counts on the identifier of leaf ``leaf`` (``cost`` for a leaf
        whose selector did not resolve: it counts nothing)."""
        if self.costs:
            k = self.leaf_identifiers[leaf]
            if k >= 0:
                return self.costs[k]
        return self.cost

    def depth(self, leaf: int) -> int:
        """Sliding log: how many of the newest hits decide leaf ``leaf``; the call is
        refused when that many are inside the window (``count - cost + 1``)."""
        return self.compiled.rules[leaf].count - int(self.leaf_cost(leaf)) + 1


_new = object.__new__
_new_tuple = tuple.__new__
_SET = {field.name: Plan.__dict__[field.name].__set__ for field in fields(Plan)}
(
    _COMPILED, _NAMESPACE, _KEY, _IDENTIFIERS, _LEAF_IDENTIFIERS, _COST, _ALGORITHM, _WINDOWS,
    _LEAF_WINDOWS, _RECORD, _COSTS,
) = _SET.values()  # fmt: skip


def _plan(
    compiled: CompiledTree,
    namespace: str,
    key: str,
    identifiers: tuple[Identifier, ...],
    leaf_identifiers: tuple[int, ...],
    cost: float,
    algorithm: Algorithm,
    windows: tuple[tuple[int, ...], ...],
    leaf_windows: tuple[int, ...],
    record: bool,
    costs: tuple[float, ...] = (),
) -> Plan:
    """``Plan(...)`` at a fraction of the frozen ``__init__``'s cost (it sets each field
    through ``object.__setattr__``): the slots are set directly. The result is the same
    immutable ``Plan``; this is the plan cache's miss path. Its parameters are the
    dataclass's fields, in order: checked when this module loads, so a field added to
    ``Plan`` and not here fails at import, not at its first read."""
    plan = _new(Plan)
    _COMPILED(plan, compiled)
    _NAMESPACE(plan, namespace)
    _KEY(plan, key)
    _IDENTIFIERS(plan, identifiers)
    _LEAF_IDENTIFIERS(plan, leaf_identifiers)
    _COST(plan, cost)
    _ALGORITHM(plan, algorithm)
    _WINDOWS(plan, windows)
    _LEAF_WINDOWS(plan, leaf_windows)
    _RECORD(plan, record)
    _COSTS(plan, costs)
    return plan


if list(inspect.signature(_plan).parameters) != list(_SET):  # pragma: no cover - a Plan edit
    raise ImportError(f"plan._plan must set Plan's fields in order: {list(_SET)}")


@dataclass(frozen=True, slots=True)
class CounterUpdate:
    """Kong's counter API: add ``value`` to the current window of ``size_us`` on
    ``identifier`` (0 only reads), then return the sliding rate. ``weight`` is the previous
    window's weight, or ``None`` for ``(size - elapsed) / size``; 0 gives a fixed window."""

    identifier: Identifier
    size_us: int
    value: float
    weight: float | None


Cost = float | tuple[float, ...]
"""What one call counts: a number, on every rule; or a tuple of one number per leaf of the
compiled tree (in ``compiled.rules`` order). Leaves counting on one identifier count once,
at the largest of their costs."""


def _counted(selector: str | None) -> str | None:
    """The selector name an identifier carries: ``name#n`` counts on ``name``."""
    return selector.partition("#")[0] if selector is not None and "#" in selector else selector


PLANS = 16_384
"""Plans kept (:func:`cached_plan`), and what stores keep per plan (their commands, their
layouts): as many identifiers as a process decides for in turn without building their plans
again. Not more: each plan kept is about seven objects the garbage collector walks, and its
pauses hold up every decision under way (what both cost: docs/benchmark.md, "What the
bounds cost")."""


@functools.lru_cache(maxsize=PLANS)
def cached_plan(
    compiled: CompiledTree,
    namespace: str,
    key: str,
    values: tuple[str | None, ...],
    cost: Cost,
    algorithm: Algorithm | str,
    record: bool = True,
) -> Plan:
    """The plan for selector ``values`` given in the order of ``compiled.selectors``; the
    callers of a hot key share one (so nobody changes it). A selector ``name#n`` has a value
    of its own and counts on the identifier of ``name`` with that value.

    ``cost``: what the call counts on every rule, or a tuple of one cost per leaf (see
    :data:`Cost`). ``algorithm``: the :class:`~ratelimit.algorithms.Algorithm` (or its
    name)."""
    if type(algorithm) is str:
        algorithm = named(algorithm)
    assert isinstance(algorithm, Algorithm)
    if isinstance(cost, tuple):
        if len(compiled.rules) > 1 and min(cost) != max(cost):
            return _plan_with_costs(compiled, namespace, key, values, cost, algorithm, record)
        cost = max(cost)
    if not algorithm.windowed and len(compiled.rules) == 1:  # the common case, quickly
        rule = compiled.rules[0]
        selector = _counted(rule.selector)
        if selector is not None and not values[0]:
            return _plan(compiled, namespace, key, (), (-1,), cost, algorithm, (), (), record)
        identifiers = (  # Identifier(...) built in C: the plan cache's miss path
            _new_tuple(
                Identifier,
                (namespace, key, selector, None if selector is None else values[0], rule.unit),
            ),
        )
        return _plan(compiled, namespace, key, identifiers, (0,), cost, algorithm, (), (), record)
    value_of = dict(zip(compiled.selectors, values, strict=True))
    index: dict[Identifier, int] = {}
    leaf_identifiers: list[int] = []
    for rule in compiled.rules:
        if rule.selector is None:
            identifier = Identifier(namespace, key, None, None, rule.unit)
        else:
            value = value_of[rule.selector]
            if not value:
                leaf_identifiers.append(-1)
                continue
            identifier = Identifier(namespace, key, _counted(rule.selector), value, rule.unit)
        leaf_identifiers.append(index.setdefault(identifier, len(index)))
    if not algorithm.windowed:
        return _plan(
            compiled, namespace, key, tuple(index), tuple(leaf_identifiers), cost, algorithm,
            (), (), record,
        )  # fmt: skip
    sizes: list[dict[int, None]] = [{} for _ in index]
    for rule, i in zip(compiled.rules, leaf_identifiers, strict=True):
        if i >= 0:
            sizes[i][rule.span_ms * US_PER_MS] = None
    windows = tuple(tuple(s) for s in sizes)
    leaf_windows = tuple(
        windows[i].index(rule.span_ms * US_PER_MS) if i >= 0 else -1
        for rule, i in zip(compiled.rules, leaf_identifiers, strict=True)
    )
    return _plan(
        compiled, namespace, key, tuple(index), tuple(leaf_identifiers), cost, algorithm,
        windows, leaf_windows, record,
    )  # fmt: skip


def _plan_with_costs(
    compiled: CompiledTree,
    namespace: str,
    key: str,
    values: tuple[str | None, ...],
    per_leaf: tuple[float, ...],
    algorithm: Algorithm,
    record: bool,
) -> Plan:
    """:func:`cached_plan` for leaves of different costs: each identifier counts the largest
    cost of its leaves (leaves on one identifier count once per call)."""
    base = cached_plan(compiled, namespace, key, values, max(per_leaf), algorithm, record)
    costs = [0.0] * len(base.identifiers)
    for k, leaf_cost in zip(base.leaf_identifiers, per_leaf, strict=True):
        if k >= 0:
            costs[k] = max(costs[k], leaf_cost)
    if len(set(costs)) <= 1:  # the identifiers that count all count the same
        return base
    return _plan(
        compiled, namespace, key, base.identifiers, base.leaf_identifiers, base.cost, algorithm,
        base.windows, base.leaf_windows, record, tuple(costs),
    )  # fmt: skip
