"""Redis key layout. Only the Redis backends use it; front ends never build keys. The
names of identifiers themselves come from :mod:`ratelimit.backends.naming`.

::

    rl:{<namespace>:<key>}                      a rule without a selector
    rl:{<namespace>:<key>}:<selector>=<value>   a rule with a selector
    rl:{<namespace>:<key>}:lock                 the command engine's lock
    rl:{<namespace>:<key>}:lock:wake            its wake-ups (a list of at most one)
    rl:{<namespace>:<key>}:revoked:<token>      a concurrency claim given back before its
                                                take was answered (a take of it is refused)
    rl:{<namespace>:<key>}[:<selector>=<value>]:w   window counters (a hash: window_fields)
    rl:{<namespace>:<key>}[:<selector>=<value>]:n   the largest count kept on that log
    rl:{<namespace>:<key>}[:<selector>=<value>]:g:<span_ms>[/<count>/<burst>]
                                                    a GCRA arrival time (per span)
    rl:{<namespace>:<key>}[:<selector>=<value>]:c   concurrency slots (a sorted set)
    rl:{<namespace>:<key>}[:<selector>=<value>]:r   when it was last reset (us)

Every part is percent-encoded (only ``A-Z a-z 0-9 _ . - / @ +`` stay as they are), so
``:``, ``{``, ``}``, ``=``, ``#`` and spaces in a value cannot make two identifiers share a
key or break the hash tag. A part longer than 64 characters once encoded becomes ``#`` and a
128-bit BLAKE2b digest of its UTF-8 bytes, so keys stay short whatever the values are. The
hash tag ``{<namespace>:<key>}`` puts every key of one limit in one Redis Cluster slot.

Spread (a store of many nodes, a tree that spreads: ``CompiledTree.spreads``),
each identifier with a selector has a hash tag of its own, and every key above that belongs
to it follows it::

    rl:{<namespace>:<key>:<selector>=<value>}[!<unit>][:w|:n|:g:<span_ms>|:c|:r]
    rl:{<namespace>:<key>:<selector>=<value>}:lock            (and :lock:wake, :revoked:<token>)

so that one limit's identifiers spread over the slots (and nodes), and one call, which
counts on the identifiers of one value only, still touches one slot. The brace closes
after the value, where the pinned layout's closes after the key: no spread key can be a
pinned one (a pinned tag has one encoded ``:``, a spread tag two, and no part has any).
"""

from __future__ import annotations

import functools

from ratelimit.backends.layout import arrival_slots, gcra_field
from ratelimit.backends.naming import MAX_PART as MAX_PART
from ratelimit.backends.naming import PREFIX, selector_part
from ratelimit.backends.naming import encode_part as encode_part
from ratelimit.backends.naming import identifier_key as identifier_key
from ratelimit.backends.naming import tag as tag
from ratelimit.backends.windows import slot_of
from ratelimit.core.plan import Identifier, Plan
from ratelimit.rules.tree import Rule


def spread_tag(identifier: Identifier) -> str:
    """The key prefix, with its hash tag, of one identifier kept apart (spread): every key
    of its (namespace, key, selector, value), whatever its unit."""
    return (
        f"{PREFIX}:{{{encode_part(identifier.namespace)}:{encode_part(identifier.key)}:"
        f"{selector_part(identifier.selector or '')}={encode_part(identifier.value or '')}}}"
    )


def name_of(identifier: Identifier, spread: bool = False) -> str:
    """The key of one identifier: :func:`identifier_key` (pinned: the limit's hash tag), or
    under its own hash tag when ``spread`` (an identifier without a selector never is)."""
    if not spread or identifier.selector is None:
        return identifier_key(identifier)
    name = spread_tag(identifier)
    return name if identifier.unit is None else f"{name}!{identifier.unit}"


def prefix_of(
    namespace: str, key: str, identifiers: tuple[Identifier, ...], spread: bool = False
) -> str:
    """The hash tag shared by the keys of one plan or claim on ``identifiers`` (all of one
    value when ``spread``: a tree that spreads names one selector), which the command
    engine's lock and a claim's revoked marks carry too."""
    if spread and identifiers and identifiers[0].selector is not None:
        return spread_tag(identifiers[0])
    return tag(namespace, key)


def counter_key(identifier: Identifier, spread: bool = False) -> str:
    """The hash of one identifier's window counters. Its ``:w`` suffix cannot end a log key
    (values are encoded without ``:``), so logs and counters never share a key."""
    return f"{name_of(identifier, spread)}:w"


def kept_key(identifier: Identifier, spread: bool = False) -> str:
    """The companion of a sliding log: the largest count any limit on it asked to keep, so
    that a limit of a smaller count never trims what a larger one reads."""
    return kept_of(name_of(identifier, spread))


def kept_of(name: str) -> str:
    """:func:`kept_key` of the identifier whose key is ``name``."""
    return f"{name}:n"


def arrival_key(
    identifier: Identifier, rule: Rule, field: str | None = None, spread: bool = False
) -> str:
    """One identifier's GCRA arrival time under rules of ``rule``'s span (``field``, else
    :func:`~ratelimit.backends.layout.gcra_field`): a string, ``us:remainder:count`` (the
    count of the rule it was stored under: a rule of another count rescales it)."""
    return f"{name_of(identifier, spread)}:g:{field or gcra_field(rule)}"


def arrival_keys(plan: Plan, spread: bool = False) -> list[str]:
    """The arrival-time keys a GCRA plan reads, in the order of
    :func:`~ratelimit.backends.layout.arrival_slots`."""
    times, _ = arrival_slots(plan.compiled, plan.leaf_identifiers)
    return [arrival_key(plan.identifiers[i], rule, field, spread) for i, rule, field in times]


def plan_keys(plan: Plan, spread: bool = False) -> list[str]:
    """Every key a plan's identifiers may have, for a reset: their logs, the logs'
    companions, their counters, and the arrival times of the plan's own rules."""
    keys = [k for identifier in plan.identifiers for k in stored_keys(identifier, spread)]
    return keys + arrival_keys(plan, spread)


def reset_key(identifier: Identifier, spread: bool = False) -> str:
    """When one identifier was last reset (store time, us), kept while a call reserved
    before it could still be refunded: such a refund takes nothing (``settle_*.lua``)."""
    return f"{name_of(identifier, spread)}:r"


def slots_key(identifier: Identifier, spread: bool = False) -> str:
    """The sorted set of one identifier's concurrency slots: holders' tokens scored by
    when their lease ends."""
    return f"{name_of(identifier, spread)}:c"


def revoked_key(prefix: str, token: str) -> str:
    """The mark of a concurrency claim given back while its take may still be on its way
    (``release_slots(..., revoke=True)``): a take of ``token`` refuses while it lasts. The
    token is the claim's own hex; ``prefix`` the hash tag its keys share
    (:func:`prefix_of`)."""
    return f"{prefix}:revoked:{token}"


def lock_key(prefix: str) -> str:
    """The command engine's lock for the keys under ``prefix`` (:func:`prefix_of`: one per
    (namespace, key), or per identifier where they spread): same hash tag as its counters."""
    return f"{prefix}:lock"


def stored_keys(identifier: Identifier, spread: bool = False) -> tuple[str, str, str]:
    """The keys one identifier may have whatever its rules: its log, the log's companion,
    its counters (arrival times are per rule: :func:`plan_keys`)."""
    name = name_of(identifier, spread)
    return name, kept_of(name), f"{name}:w"


@functools.lru_cache(maxsize=256)
def window_fields(size_us: int) -> tuple[str, str, str, str]:
    """The window-counter hash's fields for window size ``size_us``, in the order of
    :data:`ratelimit.backends.windows.Slots` (the scripts' ``lua/_windows.lua`` names them alike):
    ``S:0`` and ``S:1`` hold the two slots' counts, ``S:0w`` and ``S:1w`` their windows."""
    return f"{size_us}:0", f"{size_us}:0w", f"{size_us}:1", f"{size_us}:1w"


def slot_fields(size_us: int, index: int) -> tuple[str, str]:
    """The (count, window index) fields of the slot that holds window ``index``."""
    fields = window_fields(size_us)
    slot = slot_of(index)
    return fields[2 * slot], fields[2 * slot + 1]
