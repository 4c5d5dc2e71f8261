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
"""

from __future__ import annotations

import functools

from ratelimit.backends.layout import arrival_slots, gcra_field
from ratelimit.backends.naming import MAX_PART as MAX_PART
from ratelimit.backends.naming import encode_part as encode_part
from ratelimit.backends.naming import identifier_key as identifier_key
from ratelimit.backends.naming import tag as tag
from ratelimit.plan import Identifier, Plan
from ratelimit.rules import Rule
from ratelimit.windows import slot_of


def counter_key(identifier: Identifier) -> str:
    """The hash of one identifier's window counters. Its ``:w`` suffix cannot end a log key
    (values are encoded without ``:``), so logs and counters never share a key."""
    return f"{identifier_key(identifier)}:w"


def kept_key(identifier: Identifier) -> str:
    """The companion of a sliding log: the largest count any limit on it asked to keep, so
    that a limit of a smaller count never trims what a larger one reads."""
    return kept_of(identifier_key(identifier))


def kept_of(name: str) -> str:
    """:func:`kept_key` of the identifier whose key is ``name``."""
    return f"{name}:n"


def arrival_key(identifier: Identifier, rule: Rule, field: str | None = None) -> str:
    """One identifier's GCRA arrival time under rules of ``rule``'s span (``field``, else
    :func:`~ratelimit.backends.layout.gcra_field`): a string, ``us:remainder:count`` (the
    count of the rule it was stored under: a rule of another count rescales it)."""
    return f"{identifier_key(identifier)}:g:{field or gcra_field(rule)}"


def arrival_keys(plan: Plan) -> list[str]:
    """The arrival-time keys a GCRA plan reads, in the order of
    :func:`~ratelimit.backends.layout.arrival_slots`."""
    times, _ = arrival_slots(plan.compiled, plan.leaf_identifiers)
    return [arrival_key(plan.identifiers[i], rule, field) for i, rule, field in times]


def plan_keys(plan: Plan) -> list[str]:
    """Every key a plan's identifiers may have, for a reset: their logs, the logs'
    companions, their counters, and the arrival times of the plan's own rules."""
    keys = [k for identifier in plan.identifiers for k in stored_keys(identifier)]
    return keys + arrival_keys(plan)


def reset_key(identifier: Identifier) -> str:
    """When one identifier was last reset (store time, us), kept while a call reserved
    before it could still be refunded: such a refund takes nothing (``settle_*.lua``)."""
    return f"{identifier_key(identifier)}:r"


def slots_key(identifier: Identifier) -> str:
    """The sorted set of one identifier's concurrency slots: holders' tokens scored by
    when their lease ends."""
    return f"{identifier_key(identifier)}:c"


def revoked_key(namespace: str, key: str, token: str) -> str:
    """The mark of a concurrency claim given back while its take may still be on its way
    (``release_slots(..., revoke=True)``): a take of ``token`` refuses while it lasts. The
    token is the claim's own hex (a claim's keys share one hash tag: the tag's)."""
    return f"{tag(namespace, key)}:revoked:{token}"


def lock_key(namespace: str, key: str) -> str:
    """The command engine's lock for one (namespace, key): same hash tag as its counters."""
    return f"{tag(namespace, key)}:lock"


def stored_keys(identifier: Identifier) -> tuple[str, str, str]:
    """The keys one identifier may have whatever its rules: its log, the log's companion,
    its counters (arrival times are per rule: :func:`plan_keys`)."""
    return identifier_key(identifier), kept_key(identifier), counter_key(identifier)


@functools.lru_cache(maxsize=256)
def window_fields(size_us: int) -> tuple[str, str, str, str]:
    """The window-counter hash's fields for window size ``size_us``, in the order of
    :data:`ratelimit.windows.Slots` (the scripts' ``lua/_windows.lua`` names them alike):
    ``S:0`` and ``S:1`` hold the two slots' counts, ``S:0w`` and ``S:1w`` their windows."""
    return f"{size_us}:0", f"{size_us}:0w", f"{size_us}:1", f"{size_us}:1w"


def slot_fields(size_us: int, index: int) -> tuple[str, str]:
    """The (count, window index) fields of the slot that holds window ``index``."""
    fields = window_fields(size_us)
    slot = slot_of(index)
    return fields[2 * slot], fields[2 * slot + 1]
