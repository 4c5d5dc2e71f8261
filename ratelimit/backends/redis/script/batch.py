"""Many script calls in one: the batch script, and how a pipeline's batch becomes one call.

When the automatic pipeline has several calls ready for one connection, most of a script
call's cost on the server is the call itself (argument handling, the script's lookup, a Lua
stack), paid once per decision. :data:`BATCH` is one script that runs the decision and
settle scripts (:data:`BATCHED`, each as a Lua function of its own ``KEYS`` and ``ARGV``)
in order, each under ``pcall``: a call that errs answers its own error and the others go on.
Each call is as atomic as alone (the whole batch is), and is decided exactly as it would
be alone, at the server's instant: one ``TIME`` for the batch, which every call that did
not bring its own time is given as ``ARGV[1]``, marked with a ``+`` (``_time.lua``'s
``injected`` is false for it: a key kept as long as on the server's clock, not as under an
injected clock).

Every key is declared: ``KEYS`` is the calls' keys one after the other, and ``ARGV[1]`` says
per call its script, how many keys and how many arguments it has (``"f k a f k a ..."``),
so it stays valid on servers that refuse undeclared keys. On Redis Cluster a batch holds
only calls whose keys share a hash tag (every key of one limit does): one slot.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from ratelimit.backends.redis.resp import Command, Script, bulk
from ratelimit.backends.redis.script.held import HELD
from ratelimit.backends.redis.script.scripts import BY_ALGORITHM

BATCHED: tuple[Script, ...] = tuple(
    {
        s.sha: s
        for a in BY_ALGORITHM.values()
        for s in (a.script, a.settle, a.one)
        if s is not None
    }.values()
) + tuple(HELD.values())
"""The scripts a batch runs: every algorithm's decision and settle script (and its script
for one rule, if it has one), and the decision scripts' held variants
(:mod:`~ratelimit.backends.redis.script.held`)."""

_HEAD = """\
-- batch: run many calls of the decision and settle scripts in one (see batch.py). Each
-- script below is a function of its own KEYS and ARGV; ARGV[1] of the batch says per call
-- "script keys args"; KEYS and ARGV[2..] are the calls' own, one after the other.
if redis.replicate_commands then redis.replicate_commands() end
local scripts = {}
local parsed = {}  -- numbers parsed and formatted once for the batch (_helpers.lua)
"""
SHARED = "local parsed = {}  -- batch: shared\n"
"""The line of ``_helpers.lua`` the batch script drops: its calls share the batch's."""

_TAIL = """\
local out, k, a, instant = {}, 0, 1, nil
for f, nk, na in string.gmatch(ARGV[1], '(%d+) (%d+) (%d+)') do
  nk, na = tonumber(nk), tonumber(na)
  local keys, argv = {}, {}
  for j = 1, nk do keys[j] = KEYS[k + j] end
  for j = 1, na do argv[j] = ARGV[a + j] end
  k, a = k + nk, a + na
  if argv[1] == '' then  -- the server's instant, read once for the batch
    if not instant then
      local t = redis.call('TIME')
      instant = '+' .. t[1] .. string.format('%06d', tonumber(t[2]))  -- '+': the server's
    end
    argv[1] = instant
  end
  local ok, reply = pcall(scripts[tonumber(f)], keys, argv)
  if not ok then
    if type(reply) ~= 'table' or not reply.err then reply = {err = tostring(reply)} end
  elseif reply == nil then
    reply = false  -- a nil reply, which would leave a hole in `out`
  end
  out[#out + 1] = reply
end
return out
"""


def batch_source(scripts: Sequence[Script]) -> str:
    """The batch script running ``scripts`` (function ``n`` is ``scripts[n - 1]``)."""
    parts = [_HEAD]
    for n, script in enumerate(scripts, 1):
        body = script.source.decode().replace(SHARED, "")  # one `parsed` for the batch
        parts.append(f"scripts[{n}] = function(KEYS, ARGV)\n{body}\nend\n")
    parts.append(_TAIL)
    return "".join(parts)


BATCH = Script(batch_source(BATCHED))
"""The batch script."""

_NUMBER = {s.sha: n for n, s in enumerate(BATCHED, 1)}

Layout = list[list[int]]
"""Per command sent, the positions of the calls it carries among those given."""


def tag_of(command: Command) -> str:
    """The hash tag of a command's first key (its Redis Cluster slot's), ``""`` if none."""
    if not command.keys:
        return ""
    key = command.keys[0]
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start + 1 : end] if start >= 0 and end > start + 1 else key


def combine(commands: list[Command], by_slot: bool) -> tuple[list[Command], Layout | None]:
    """``commands`` as fewer: the batchable ones (:data:`BATCHED`) joined into one batch
    call, or one per hash tag (``by_slot``, for Redis Cluster), sent where the first of
    them was; the rest as they are. The layout says how to :func:`split` the replies;
    ``None`` when nothing was joined."""
    if not by_slot and len(commands) > 1 and all(c.script.sha in _NUMBER for c in commands):
        return [batch_command(commands)], [list(range(len(commands)))]  # the common batch
    groups: dict[str, list[int]] = {}
    for i, command in enumerate(commands):
        if command.script.sha in _NUMBER:
            groups.setdefault(tag_of(command) if by_slot else "", []).append(i)
    joined = {group[0]: group for group in groups.values() if len(group) > 1}
    if not joined:
        return commands, None
    taken = {i for group in joined.values() for i in group}
    sent: list[Command] = []
    layout: Layout = []
    for i, command in enumerate(commands):
        if i in joined:
            sent.append(batch_command([commands[j] for j in joined[i]]))
            layout.append(joined[i])
        elif i not in taken:
            sent.append(command)
            layout.append([i])
    return sent, layout


def split(replies: Sequence[object], layout: Layout) -> list[object]:
    """The replies of the commands :func:`combine` was given, in their order, from the
    replies to what it sent. A batch call that failed as a whole gives each of its calls
    that error; one whose reply is not a list of one reply per call (not the batch
    script's: something other than Redis answered) gives each a ``ValueError`` saying so."""
    if len(layout) == 1 and len(layout[0]) > 1:  # one batch call carrying every call
        reply = replies[0]
        if isinstance(reply, list) and len(reply) == len(layout[0]):
            return reply  # in order: combine() joined them so
    result: list[object] = [None] * sum(map(len, layout))
    for positions, reply in zip(layout, replies, strict=True):
        if len(positions) == 1:
            result[positions[0]] = reply
            continue
        if not isinstance(reply, Exception) and (
            not isinstance(reply, list) or len(reply) != len(positions)
        ):
            reply = ValueError(f"a batch of {len(positions)} calls answered {reply!r:.200}")
        for n, position in enumerate(positions):
            result[position] = reply if isinstance(reply, Exception) else reply[n]
    return result


@functools.lru_cache(maxsize=256)
def _piece(sha: bytes, keys: int, args: int) -> str:
    """One call's part of the batch's ``ARGV[1]``: its script's number, keys, arguments."""
    return f"{_NUMBER[sha]} {keys} {args}"


def batch_command(commands: list[Command]) -> Command:
    """One call of :data:`BATCH` carrying ``commands`` (all of :data:`BATCHED`)."""
    header = " ".join([_piece(c.script.sha, len(c.keys), len(c.args)) for c in commands])
    keys = [k for c in commands for k in c.keys]
    args: list[bytes] = [header.encode()]
    for c in commands:
        args += c.args
    packed_args = b"".join([bulk(args[0])] + [c.packed_args for c in commands])
    return Command(BATCH, keys, args, packed_args, b"".join([c.packed_keys for c in commands]))
