"""The rules the workers of ``ratelimit serve --workers N`` hold, for a worker started again.

A worker's watcher never removes a limit on its own (:class:`~ratelimit.service.
rules_file.RulesWatcher`): once the file lost one without SIGHUP, the rules in force are
not the file as written. So that a worker started again (after it died) decides as its
siblings do, the supervisor gives its workers a snapshot file in a directory of its own
(:data:`SNAPSHOT`, removed when it stops), and each worker writes there the bytes of the
rules file it applied: at start, and after each reload it applied (SIGHUP's included). A
worker that starts reads the snapshot first: when it differs from the file, it starts
with the snapshot's rules and looks at the file at once, as its siblings did (applying it
if it removes nothing; SIGHUP applies it as written). The rules in force are always the
bytes of one file, so the bytes are the whole state; writes replace the snapshot whole
(a rename), so a reader never sees half of one.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ratelimit.errors import ConfigurationError
from ratelimit.service.rules_file import RulesFile, load, parse

SNAPSHOT = "RATELIMIT_RULES_SNAPSHOT"
"""Set by the supervisor of ``--workers N`` in each worker's environment: the path of the
snapshot of the rules the workers hold."""
logger = logging.getLogger("ratelimit.service")


class Snapshot:
    """The snapshot file at ``path``, shared by the workers of one supervisor."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> bytes | None:
        """The bytes of the rules last applied by a worker; ``None`` before any."""
        try:
            return Path(self.path).read_bytes()
        except OSError:
            return None

    def write(self, content: bytes) -> None:
        """Replace the snapshot by ``content``, whole (logged when it cannot be: a worker
        started again then reads the file as written)."""
        partial = f"{self.path}.{os.getpid()}"
        try:
            Path(partial).write_bytes(content)
            os.replace(partial, self.path)
        except OSError as exc:
            logger.warning("ratelimit: rules snapshot %s not written: %s", self.path, exc)


def starting_rules(
    path: str | None, algorithm: str, snapshot: Snapshot | None
) -> tuple[RulesFile | None, bool]:
    """The rules a service starts with (``None`` without a rules file), and whether its
    file is to be looked at at once: the snapshot's, when there is one that differs from
    the file (``True``), else the file's (``ConfigurationError`` for a bad one, as at any
    start). A worker that loaded the file writes it to the snapshot."""
    if not path:
        return None, False
    held = None if snapshot is None else snapshot.read()
    if held is not None:
        try:
            current: bytes | None = Path(path).read_bytes()
        except OSError:
            current = None
        if held != current:
            try:
                return parse(held, path, algorithm), True
            except ConfigurationError as exc:  # not one this version reads: the file's
                logger.warning("ratelimit: rules snapshot not read: %s", exc)
    rules = load(path, algorithm)
    if snapshot is not None and rules.content != held:
        snapshot.write(rules.content)
    return rules, False
