"""A directory of envoyproxy/ratelimit configuration files, loaded as its loader loads them.

Every file of the directory and of the directories in it, in name order (as its runtime
loader walks it; a symbolic link to a directory is not followed, one to a file is read),
is read and decoded
(:func:`~ratelimit.service.envoy_config.yaml_go.root_of`), then the domains are loaded in that
order (:class:`~ratelimit.service.envoy_config.descriptors.EnvoyConfig`), so that of two files
holding the same domain or composite key the second is named. A file is named in errors as
the directory joined with its name, as its ``config_check_cmd`` names it. Dot files are
skipped when asked (``RUNTIME_IGNOREDOTFILES``), and so are dot directories: a Kubernetes
ConfigMap's ``..2026_...`` directory holds a second copy of every file.

Example::

    config = load_directory("/srv/runtime_data/current/ratelimit/config")
    matched = config.limit_of("edge", [("remote_address", "10.0.0.1")])
"""

from __future__ import annotations

import os
from pathlib import Path

from ratelimit.service.envoy_config.descriptors import EnvoyConfig
from ratelimit.service.envoy_config.yaml_go import ConfigFileError, root_of


def load_directory(
    directory: str | os.PathLike[str],
    merge_domains: bool = False,
    ignore_dotfiles: bool = False,
    algorithm: str | None = None,
) -> EnvoyConfig:
    """The domains of every file in ``directory``; :class:`ConfigFileError`
    (``"<file>: <message>"``) for the first file its loader refuses, ``OSError`` for a
    directory or file that cannot be read. ``algorithm``: the limits are for our algorithm
    (:mod:`~ratelimit.service.envoy_config.ours`), and may be written as ours allow."""
    roots = []
    for path in _files(os.fspath(directory), ignore_dotfiles):
        text = Path(path).read_text(encoding="utf-8")
        roots.append((path, root_of(path, text, bool(algorithm))))
    config = EnvoyConfig(merge_domains, algorithm)
    for path, root in roots:
        config.load(path, root)
    return config


def _files(directory: str, ignore_dotfiles: bool) -> list[str]:
    """The files under ``directory``, depth first in name order."""
    found: list[str] = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if ignore_dotfiles and entry.name.startswith("."):
            continue
        path = os.path.join(directory, entry.name)
        if entry.is_dir(follow_symlinks=False):
            found += _files(path, ignore_dotfiles)
        elif not entry.is_dir():  # a link to a directory is not followed
            found.append(path)
    return found


def check_directory(
    directory: str | os.PathLike[str], merge_domains: bool = False, algorithm: str | None = None
) -> tuple[bool, list[str]]:
    """``config_check_cmd``: whether ``directory`` loads, and the lines to print (its own:
    ``checking rate limit configs...``, then ``all rate limit configs ok`` or ``error
    loading rate limit configs: <file>: <message>``)."""
    lines = ["checking rate limit configs...", f"loading config directory: {directory}"]
    try:
        load_directory(directory, merge_domains, algorithm=algorithm)
    except ConfigFileError as exc:
        return False, [*lines, f"error loading rate limit configs: {exc}"]
    except OSError as exc:
        return False, [*lines, f"error opening directory {directory}: {exc.strerror or exc}"]
    return True, [*lines, "all rate limit configs ok"]
