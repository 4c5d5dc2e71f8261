"""The decision scripts of the script engine, and what each algorithm sends them.

Redis scripts cannot import, so each is its shared parts (a prelude, :data:`GENERAL` or
:data:`ONE`; ``_tree.lua``, ``_log.lua``, ``_windows.lua``, ``_gcra.lua``) joined to its own
file. :data:`BY_ALGORITHM` is the script engine's
table of what it supports: per algorithm, its script, the keys a plan reads, how leaves map
to those keys, and the ARGV the script reads after the common ones.

Every key of a plan follows one layout (:mod:`~ratelimit.backends.redis.keys`): pinned (the
limit's hash tag), or spread (each identifier with a selector under its own) where the
engine spreads (``spread`` below is the engine's setting; a tree compiled pinned is pinned
whatever it says). Decisions, their settles and resets of one plan build their keys here
alike, so a settle and a reset find what the decision wrote.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib import resources
from typing import NamedTuple

from ratelimit.algorithms import (
    FIXED_WINDOW,
    GCRA,
    SLIDING_LOG,
    SLIDING_WINDOW,
    US_PER_MS,
    gcra_burst,
)
from ratelimit.backends.base import Clock, clock_us
from ratelimit.backends.layout import arrival_slots
from ratelimit.backends.redis.keys import (
    arrival_keys,
    counter_key,
    kept_of,
    name_of,
    reset_key,
)
from ratelimit.backends.redis.resp import Command, Script, bulk, pack_args, pack_keys
from ratelimit.core.plan import PLANS, CompiledTree, Plan
from ratelimit.core.settling import Settlement

_LUA = resources.files("ratelimit.backends.redis").joinpath("lua")


def lua(*parts: str) -> str:
    """A script from its files: Redis scripts cannot import, so shared parts are joined, and
    a line ``--@ name.lua`` is replaced by that file (a block joined inline, in a function of
    a general script and at the top of a one-rule script alike)."""
    return "\n".join(_joined(part) for part in parts)


def _joined(part: str) -> str:
    lines = _LUA.joinpath(part).read_text().splitlines(keepends=True)
    return "".join(_joined(line.split()[1]) if line.startswith("--@ ") else line for line in lines)


GENERAL = ("_helpers.lua", "_time.lua")
"""The prelude of every script but the one-rule ones: the caches a tree's numbers are parsed
into once per call (or batch), then the time."""
ONE = ("_one.lua", "_time.lua")
"""The prelude of the one-rule scripts: no caches, then the time, as :data:`GENERAL`'s."""

SLIDING_LOG_LUA = lua(*GENERAL, "_tree.lua", "_log.lua", "sliding_log.lua")
WINDOW_COUNTERS_LUA = lua(*GENERAL, "_tree.lua", "_windows.lua", "window_counters.lua")
GCRA_LUA = lua(*GENERAL, "_tree.lua", "_gcra.lua", "gcra.lua")
SETTLE_LOG_LUA = lua(*GENERAL, "_tree.lua", "_log.lua", "settle_log.lua")
SETTLE_WINDOWS_LUA = lua(*GENERAL, "_tree.lua", "_windows.lua", "settle_windows.lua")
SETTLE_GCRA_LUA = lua(*GENERAL, "_tree.lua", "_gcra.lua", "settle_gcra.lua")
SLIDING_LOG_ONE = Script(lua(*ONE, "sliding_log_one.lua"))
"""``sliding_log.lua`` for one rule whose selector resolved, on one list (most limits): the
same block (``_log_one.lua``) decides it, without the tree to parse, the caches to make or
a function to call (:func:`plan_command` picks it)."""
GCRA_ONE = Script(lua(*ONE, "gcra_one.lua"))
"""``gcra.lua`` for one rule whose selector resolved, on its one arrival time: the same
block (``_gcra_one.lua``) decides it, without the tree to parse, the caches to make or a
function to call (:func:`plan_command` picks it)."""

Slots = Callable[[CompiledTree, tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...] | None]]
"""Per leaf the position of its key in KEYS (``-1``: none), and per key the identifier it
belongs to (``None``: key ``k`` is identifier ``k``'s)."""


class Scripted(NamedTuple):
    """One algorithm on the script engine."""

    script: Script
    keys: Callable[[Plan, bool], list[str]]
    """The keys a plan's script reads and writes, spread (``True``) or pinned."""
    slots: Slots
    extra: Callable[[CompiledTree], tuple[bytes, ...]]
    """What the script reads after the common ARGV (tree, slots, costs, record)."""
    whole: bool
    """Whether the script's counts are whole numbers (else floats)."""
    settle: Script
    """The script that settles a call on the same keys (``settle_*.lua``)."""
    one: Script | None = None
    """The script for a tree of one rule (its selector resolved) on one key pair (the
    log's) or key (GCRA's), doing what ``script`` does for it at less cost; ``None``:
    ``script`` for every tree."""
    one_keys: int = 0
    """How many keys a plan sends ``one`` (the log and its companion; one arrival time)."""


def _per_identifier(
    compiled: CompiledTree, leaf_identifiers: tuple[int, ...]
) -> tuple[tuple[int, ...], None]:
    return leaf_identifiers, None


def _per_arrival(
    compiled: CompiledTree, leaf_identifiers: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    times, slots = arrival_slots(compiled, leaf_identifiers)
    return slots, tuple(i for i, _, _ in times)


def _log_keys(plan: Plan, spread: bool) -> list[str]:
    if len(plan.identifiers) == 1:  # the common case, without building lists twice
        name = name_of(plan.identifiers[0], spread)
        return [name, kept_of(name)]
    names = [name_of(i, spread) for i in plan.identifiers]  # each encoded once
    return names + [kept_of(name) for name in names]


def _counter_keys(plan: Plan, spread: bool) -> list[str]:
    return [counter_key(i, spread) for i in plan.identifiers]


def _bursts(compiled: CompiledTree) -> tuple[bytes, ...]:
    return (" ".join(str(gcra_burst(rule)) for rule in compiled.rules).encode(),)


_SETTLE_WINDOWS = Script(SETTLE_WINDOWS_LUA)

BY_ALGORITHM: dict[str, Scripted] = {
    SLIDING_LOG: Scripted(
        Script(SLIDING_LOG_LUA),
        _log_keys,
        _per_identifier,
        lambda _: (),
        True,
        Script(SETTLE_LOG_LUA),
        SLIDING_LOG_ONE,
        2,
    ),
    SLIDING_WINDOW: Scripted(
        Script(WINDOW_COUNTERS_LUA),
        _counter_keys,
        _per_identifier,
        lambda _: (b"1",),
        False,
        _SETTLE_WINDOWS,
    ),
    FIXED_WINDOW: Scripted(
        Script(WINDOW_COUNTERS_LUA),
        _counter_keys,
        _per_identifier,
        lambda _: (b"0",),
        False,
        _SETTLE_WINDOWS,
    ),
    GCRA: Scripted(
        Script(GCRA_LUA),
        arrival_keys,
        _per_arrival,
        _bursts,
        True,
        Script(SETTLE_GCRA_LUA),
        GCRA_ONE,
        1,
    ),
}
"""The algorithms the script engine decides, by name."""


@functools.lru_cache(maxsize=1024)
def tree_wire(compiled: CompiledTree) -> bytes:
    """A compiled tree as the scripts read it (``_tree.lua``), one line of ASCII numbers:
    the leaf count, then ``count span_us`` per leaf, then the prefix program."""
    numbers = [len(compiled.rules)]
    for rule in compiled.rules:
        numbers += (rule.count, rule.span_ms * US_PER_MS)
    return " ".join(map(str, [*numbers, *compiled.program])).encode()


@functools.lru_cache(maxsize=1024)
def _args(
    compiled: CompiledTree,
    leaf_identifiers: tuple[int, ...],
    cost: float,
    record: bool,
    algorithm: str,
    costs: tuple[float, ...] = (),
) -> tuple[tuple[bytes, ...], bytes, tuple[bytes, ...], bytes]:
    """The script's ARGV after the time, plain and packed, then the whole ARGV with the time
    left to the script (Redis ``TIME``), plain and packed. They depend on the rules and
    flags, not on the selector values, so every call of a decorated function shares them.
    ``costs``: per identifier, when they differ (:attr:`Plan.costs`)."""
    scripted = BY_ALGORITHM[algorithm]
    slots, key_identifiers = scripted.slots(compiled, leaf_identifiers)
    if not costs:
        per_key: list[float] = []
    else:
        per_key = list(costs) if key_identifiers is None else [costs[i] for i in key_identifiers]
    # repr: the shortest text that reads back as the same float
    cost_text = " ".join(map(repr, per_key)) if per_key else repr(cost)
    args = (
        tree_wire(compiled),
        " ".join(str(i + 1) for i in slots).encode(),  # per leaf its key's KEYS index
        cost_text.encode(),  # one cost, or one per key
        b"1" if record else b"0",
        *scripted.extra(compiled),
    )
    packed = pack_args(args)
    return args, packed, (b"", *args), _NO_TIME + packed


def plan_command(plan: Plan, clock: Clock | None = None, spread: bool = False) -> Command:
    """The plan's ``EVALSHA``: its script, keys and arguments; the time read from ``clock``
    when one is injected (tests), else left to the script (Redis ``TIME``). ``spread``: the
    engine's setting (the keys spread where the plan's tree does too)."""
    name = plan.algorithm.name
    scripted = BY_ALGORITHM[name]
    args, packed, untimed, packed_untimed = _args(
        plan.compiled, plan.leaf_identifiers, plan.cost, plan.record, name, plan.costs
    )
    keys = scripted.keys(plan, spread and not plan.compiled.pinned)
    script = scripted.script
    if scripted.one and len(keys) == scripted.one_keys and args[1] == b"1" and args[0][:2] == b"1 ":
        script = scripted.one  # one rule, resolved
    if clock is None:  # the script reads Redis's TIME
        return Command(script, keys, untimed, packed_untimed)
    now = str(clock_us(clock)).encode()
    return Command(script, keys, (now, *args), pack_args((now,)) + packed)


def hold_command(plan: Plan, clock: Clock | None = None, spread: bool = False) -> Command:
    """The ``EVALSHA`` that holds ``plan`` (a part: :mod:`~ratelimit.backends.redis.spanning`,
    whose tree admits whatever it reads): :func:`plan_command`'s, and for GCRA a push past
    the burst's tolerance where a rule is over (``gcra.lua``'s ``"3"``), so that a later
    check sees every hit held."""
    command = plan_command(plan, clock, spread)
    if plan.algorithm.name != GCRA:
        return command
    args = (*command.args[:4], b"3", *command.args[5:])
    return Command(command.script, command.keys, args, pack_args(args))


def check_command(plan: Plan, at_us: int, spread: bool = False) -> Command:
    """The ``EVALSHA`` that checks ``plan`` (a held part's rules at cost 0:
    :mod:`~ratelimit.backends.redis.spanning`) at exactly ``at_us``, the time it was held
    at (the window counters do not move to a newer window), recording nothing."""
    command = plan_command(plan, None, spread)
    args = (str(at_us).encode(), *command.args[1:4], b"2", *command.args[5:])
    return Command(command.script, command.keys, args, pack_args(args))


_NO_TIME = pack_args((b"",))


def settle_command(
    settlement: Settlement, clock: Clock | None = None, spread: bool = False
) -> Command:
    """The ``EVALSHA`` of one settle: the settle script of the plan's algorithm, the keys
    its decision used, the tree, per leaf its key and its delta, the reservation's time,
    the script's extra arguments and, last, per leaf until when the reservation holds
    (``Settlement.held``, read by ``settle_gcra.lua``; see ``settle_*.lua``). The window
    counters, GCRA and the log also get, after their keys, each key's (the log: each
    list's) identifier's reset mark. What depends on the plan alone is built once per plan
    and layout (:func:`_settle_parts`): the call just decided on it finds it there.
    ``spread``: the engine's setting, as for :func:`plan_command`."""
    plan = settlement.plan
    script, keys, packed_keys, head, tail, whole, packed_head, packed_tail = _settle_parts(
        plan, spread and not plan.compiled.pinned
    )
    # whole hits as integers (the log's LREM count, GCRA's steps); repr: exact floats
    if whole:
        deltas = " ".join([str(int(d)) for d in settlement.deltas]).encode()
    else:
        deltas = " ".join([repr(float(d)) for d in settlement.deltas]).encode()
    now = b"" if clock is None else str(clock_us(clock)).encode()
    held = " ".join([f"{int(us)} {int(remainder)}" for us, remainder in settlement.held]).encode()
    at = str(settlement.at_us).encode()
    args = (now, *head, deltas, at, *tail, held)
    packed = b"".join([bulk(now), packed_head, bulk(deltas), bulk(at), packed_tail, bulk(held)])
    if settlement.starts:  # GCRA, a held part's refund (settle_gcra.lua's ARGV[8])
        starts = " ".join([f"{int(us)} {int(rem)}" for us, rem in settlement.starts]).encode()
        args, packed = (*args, starts), packed + bulk(starts)
    return Command(script, keys, args, packed, packed_keys)


@functools.lru_cache(maxsize=PLANS)
def _settle_parts(
    plan: Plan, spread: bool = False
) -> tuple[Script, list[str], bytes, tuple[bytes, ...], tuple[bytes, ...], bool, bytes, bytes]:
    """What a plan's settles share: the settle script, its keys (plain and packed), the
    arguments before the deltas (tree, slots) and after the time (the script's extra),
    whether deltas are whole, and those arguments packed. Kept per plan and layout
    (``spread``: the effective one), as :data:`command_of` and :data:`spread_command_of`
    keep decisions'."""
    scripted = BY_ALGORITHM[plan.algorithm.name]
    slots, owners = scripted.slots(plan.compiled, plan.leaf_identifiers)
    decided = spread_command_of(plan) if spread else command_of(plan)  # the decision's, cached
    keys = [*decided.keys, *reset_keys(plan, owners, spread)]
    head = (tree_wire(plan.compiled), " ".join(str(i + 1) for i in slots).encode())
    tail = tuple(scripted.extra(plan.compiled))
    packed = pack_args(head), pack_args(tail)
    return scripted.settle, keys, pack_keys(keys), head, tail, scripted.whole, *packed


def reset_keys(plan: Plan, owners: tuple[int, ...] | None, spread: bool = False) -> list[str]:
    """Per key of a plan's script, the :func:`reset_key` of the identifier it belongs to
    (``owners``: per key its identifier; ``None``: key ``k`` is identifier ``k``'s), in the
    effective layout ``spread``."""
    identifiers = plan.identifiers
    if owners is None:
        return [reset_key(identifier, spread) for identifier in identifiers]
    return [reset_key(identifiers[i], spread) for i in owners]


command_of = functools.lru_cache(maxsize=PLANS)(plan_command)
"""The plan's command on Redis's clock, kept per plan (plans hash by identity and are shared
through the plan cache, so every call of a decorated function finds its bytes packed). One
cache for the process, as the plan cache is: a backend keeps no cache of its own, whose
cycle through the backend would keep thousands of commands alive until the garbage
collector's slowest pass. Its keys are pinned: an engine that spreads uses
:data:`spread_command_of`."""


def _spread_command(plan: Plan) -> Command:
    return plan_command(plan, None, True)


spread_command_of = functools.lru_cache(maxsize=PLANS)(_spread_command)
""":data:`command_of` for an engine that spreads: each of the plan's identifiers with a
selector under its own hash tag (unless its tree was compiled pinned)."""
