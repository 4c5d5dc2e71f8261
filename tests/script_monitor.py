"""What a script ran, read off ``MONITOR``: the differential tests of the one-rule scripts
(tests/test_sliding_log_one.py, tests/test_gcra_one.py) compare the commands two scripts
ran, values and times to live (``PX``, ``PEXPIRE``) to the millisecond, instead of reading
times to live back a moment later (which a slow machine moves)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import redis
from redis.client import Monitor

from ratelimit.backends.redis.resp import Command, Script, pack_args
from ratelimit.backends.redis.script.batch import BATCH


def loaded(redis_url: str, *scripts: Script) -> Iterator[redis.Redis]:
    """A client of ``redis_url`` with ``scripts`` and the batch script loaded (a fixture's
    body)."""
    r = redis.Redis.from_url(redis_url)
    for script in (*scripts, BATCH):
        r.script_load(script.source)
    yield r
    r.close()


def watching(r: redis.Redis) -> Iterator[Monitor]:
    """``MONITOR`` on ``r``'s server (a fixture's body)."""
    with r.monitor() as m:  # type: ignore[no-untyped-call]
        yield m


def command(script: Script, keys: list[str], argv: tuple[bytes, ...]) -> Command:
    """``script`` on ``keys`` and ``argv``, as the engine sends it."""
    return Command(script, keys, argv, pack_args(argv))


def run(r: redis.Redis, command: Command) -> object:
    """``command``'s reply."""
    return r.evalsha(command.script.sha.decode(), len(command.keys), *command.keys, *command.args)


def inside(
    r: redis.Redis, monitor: Monitor, command: Command, *keys: str
) -> tuple[object, list[str]]:
    """Run ``command``; its reply, and the commands its script ran on ``keys`` (written K:
    whatever else runs on the server meanwhile, another test's loop, touches none)."""
    reply = run(r, command)
    mark = uuid.uuid4().hex
    r.echo(mark)
    ran: list[str] = []
    while True:
        seen = monitor.next_command()  # type: ignore[no-untyped-call]
        if seen["command"] == f"ECHO {mark}":
            return reply, ran
        text = seen["command"]
        if seen["client_type"] == "lua" and any(key in text for key in keys):
            for key in keys:
                text = text.replace(key, "K")
            ran.append(text)
