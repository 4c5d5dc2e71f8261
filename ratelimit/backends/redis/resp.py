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
    decorated function (its rules, cost and flags), so callers cache them."""

    __slots__ = ("args", "keys", "packed", "packed_args", "packed_keys", "script")

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
        if packed_keys is None:
            packed_keys = b"".join([bulk(k.encode()) for k in keys])
        self.packed_keys = packed_keys
        """The keys packed (a batch joins its calls' without packing them again)."""
        self.packed = _head(script.sha, len(keys), len(args)) + packed_keys + packed_args

    def arguments(self) -> tuple[str | int | bytes, ...]:
        """The command as redis-py's ``execute_command`` takes it."""
        return ("EVALSHA", self.script.sha.decode(), len(self.keys), *self.keys, *self.args)


def bulk(arg: bytes) -> bytes:
    """One argument in RESP."""
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


@functools.lru_cache(maxsize=64)
def _head(sha: bytes, keys: int, args: int) -> bytes:
    return b"*%d\r\n" % (3 + keys + args) + bulk(b"EVALSHA") + bulk(sha) + bulk(b"%d" % keys)


def pack_args(args: Sequence[bytes]) -> bytes:
    """Arguments packed for :class:`Command`."""
    return b"".join([bulk(a) for a in args])
