"""Decisions held back by a penalty, in the same script call (``limit(..., penalty=...)``).

A penalized limit asks, before its rules decide, whether its identifier is held back
(:mod:`ratelimit.penalties.penalizer`). On the script engine both are one call: the
*held variant* of the plan's decision script (:data:`HELD`, by the script's SHA) takes the
hold's key (:mod:`ratelimit.backends.redis.penalties`) after the plan's keys, reads it at the
decision's instant (``_held.lua``, joined after ``_time.lua``) and answers ``{-1, us left}``
while it is in force; else it decides exactly as the plain script does, on the plan's keys
alone. The variants go through the automatic pipeline and into batches
(:mod:`~ratelimit.backends.redis.script.batch`) as the plain scripts do.

The hold's key is under the limit's key's hash tag, as a plan's keys are unless they spread
(:mod:`~ratelimit.backends.redis.keys`): a call whose keys spread on a cluster client reads
the hold in a call of its own first, as before.
"""

from __future__ import annotations

import functools

from ratelimit.backends.redis.penalties import hold_key
from ratelimit.backends.redis.resp import Command, Script, pack_keys
from ratelimit.backends.redis.script.scripts import BY_ALGORITHM, lua
from ratelimit.core.plan import PLANS, Identifier

_TIME = lua("_time.lua")
_HEAD = """\
-- held: the decision script below, unless the penalty's hold in its last key is in force
-- (held.py): the script runs as a function of the other keys, and _held.lua, after
-- _time.lua, answers {-1, us left} while the hold lasts.
local hold, keys = KEYS[#KEYS], {}
for i = 1, #KEYS - 1 do keys[i] = KEYS[i] end
local function decide(KEYS, ARGV)
"""
_TAIL = "\nend\nreturn decide(keys, ARGV)\n"


def held_variant(script: Script) -> Script:
    """``script``, a decision script, held back while the hold in its last key lasts."""
    source = script.source.decode()
    assert source.count(_TIME) == 1, "a decision script reads the time once"
    body = source.replace(_TIME, _TIME + lua("_held.lua"))
    return Script(_HEAD + body + _TAIL)


HELD: dict[bytes, Script] = {
    s.sha: held_variant(s)
    for a in BY_ALGORITHM.values()
    for s in (a.script, a.one)
    if s is not None
}
"""Per decision script (by SHA), its held variant."""

HELD_BACK = -1
"""The verdict a held variant answers while the hold is in force: ``{-1, us left}``."""


@functools.lru_cache(maxsize=PLANS)
def held_of(command: Command, hold: Identifier) -> Command:
    """:func:`held_command` of a plan's command on the server's clock (kept per plan, as
    the command is: ``scripts.command_of``) and the hold of ``hold``, kept alike: every
    call of one identifier finds its bytes packed."""
    return held_command(command, hold_key(hold))


def held_command(command: Command, hold: str) -> Command:
    """``command``, a plan's decision, held back while the hold at key ``hold`` lasts."""
    return Command(
        HELD[command.script.sha],
        [*command.keys, hold],
        command.args,
        command.packed_args,
        command.packed_keys + pack_keys([hold]),
    )
