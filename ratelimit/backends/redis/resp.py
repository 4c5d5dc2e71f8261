"""Commands packed once in the Redis protocol (RESP): ``EVALSHA`` calls and their scripts.

A decorated function's calls share their script, rules, cost and flags, so their arguments
are packed once and only the keys are packed per call; the pipeline writes the bytes as
they are.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence


def pack(*args: bytes) -> bytes:
    """One command in the Redis protocol (RESP), from its arguments."""
    return b"*%d\r\n" % len(args) + pack_args(args)


class Script:
    """A Lua script: its text and SHA1, for ``SCRIPT LOAD`` and ``EVALSHA``."""

    __slots__ = ("load", "sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source.encode()
        self.sha = hashlib.sha1(self.source).hexdigest().encode()
        self.load = pack(b"SCRIPT", b"LOAD", self.source)


class Command:
    """One ``EVALSHA``: the script, its keys and arguments, packed as RESP bytes.

    ``packed_args`` is the arguments already packed: they are the same for every call of a
    decorated function (its rules, cost and flags), so callers cache them. The whole
    command (:attr:`packed`) is joined only when it goes alone: a batch joins its calls'
    keys and arguments into one call of the batch script
    (:mod:`~ratelimit.backends.redis.script.batch`) without it."""

    __slots__ = ("args", "keys", "packed_args", "packed_keys", "script")

    def __init__(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[bytes],
        packed_args: bytes,
        packed_keys: bytes | None = None,
    ) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        self.packed_args = packed_args
        self.packed_keys = pack_keys(keys) if packed_keys is None else packed_keys
        """The keys packed (a batch joins its calls' without packing them again)."""

    @property
    def packed(self) -> bytes:
        """The whole ``EVALSHA``, as sent alone."""
        head = head_of(self.script.sha, len(self.keys), len(self.args))
        return head + self.packed_keys + self.packed_args

    def arguments(self) -> tuple[str | int | bytes, ...]:
        """The command as redis-py's ``execute_command`` takes it."""
        return ("EVALSHA", self.script.sha.decode(), len(self.keys), *self.keys, *self.args)


def pack_keys(keys: Sequence[str]) -> bytes:
    """Keys (text) packed in RESP: encoded once, all together (keys are ASCII but for a
    unit of another alphabet, which takes the slower way)."""
    text = "".join([f"${len(k)}\r\n{k}\r\n" for k in keys])
    data = text.encode()
    if len(data) == len(text):
        return data
    return b"".join([bulk(k.encode()) for k in keys])


def bulk(arg: bytes) -> bytes:
    """One argument in RESP."""
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


@functools.lru_cache(maxsize=64)
def head_of(sha: bytes, keys: int, args: int) -> bytes:
    """The start of an ``EVALSHA`` of ``keys`` keys and ``args`` arguments, before its keys:
    a command is ``head_of(...) + packed_keys + packed_args``."""
    return b"*%d\r\n" % (3 + keys + args) + bulk(b"EVALSHA") + bulk(sha) + bulk(b"%d" % keys)


def pack_args(args: Sequence[bytes]) -> bytes:
    """Arguments packed for :class:`Command`."""
    return b"".join([bulk(a) for a in args])
